"""Dagster definitions built from a pipeline config: assets, jobs, sensors, resources."""

from __future__ import annotations

from dagster import Definitions

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.defs.backfill import backfill_definitions
from cdc_pipeline.defs.capture import build_drain_sensor, change_log_asset
from cdc_pipeline.defs.delivery import build_delivery_asset, build_delivery_job, build_delivery_sensor
from cdc_pipeline.defs.resources import CdcConfigResource, SinkResource, pyspark_resource, sink_resource_key


def build_definitions(path: str) -> Definitions:
    pipeline: PipelineConfig = load_config(path)
    jobs = [build_delivery_job(s) for s in pipeline.sinks]
    backfill_assets, backfill_checks, backfill_jobs, backfill_schedules = backfill_definitions(pipeline)
    return Definitions(
        assets=[change_log_asset, *(build_delivery_asset(s) for s in pipeline.sinks), *backfill_assets],
        asset_checks=backfill_checks,
        jobs=[*jobs, *backfill_jobs],
        schedules=backfill_schedules,
        sensors=[build_drain_sensor(jobs), build_delivery_sensor(jobs)],
        resources={
            "cdc": CdcConfigResource(config_path=path),
            "pyspark": pyspark_resource(pipeline),
            **{sink_resource_key(s.name): SinkResource(config_path=path, sink_name=s.name) for s in pipeline.sinks},
        },
    )
