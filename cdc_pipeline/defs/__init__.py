"""Dagster definitions built from a pipeline config.

The asset graph is the data's lineage: source tables (``source/<schema>/<table>``, specs only) ->
``cdc/change_log`` (materialized by the long-lived drain run) -> ``sink/<name>`` (each materialized by
its long-lived delivery run); a table's backfill is ``cdc/snapshot/<schema>/<table>``, downstream of
its source table and upstream of the sinks that receive it. Keys come from a `CdcTranslator`.
"""

from __future__ import annotations

from dagster import Definitions

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.defs.api_sync import api_sync_definitions
from cdc_pipeline.defs.backfill import backfill_asset_key, backfill_definitions
from cdc_pipeline.defs.capture import build_change_log_asset, build_drain_job, build_drain_sensor
from cdc_pipeline.defs.delivery import build_delivery_job, build_delivery_sensor, build_sink_asset
from cdc_pipeline.defs.replay import build_replay_job
from cdc_pipeline.defs.resources import CdcConfigResource, SinksResource, pyspark_resource
from cdc_pipeline.defs.translator import CdcTranslator, source_tables


def build_definitions(path: str, translator: CdcTranslator | None = None) -> Definitions:
    tr = translator or CdcTranslator()
    pipeline: PipelineConfig = load_config(path)
    pipeline.check_dsns()
    sources = [tr.source_spec(pipeline, t) for t in source_tables(pipeline)]
    log_key = tr.change_log_key()
    change_log = build_change_log_asset(log_key, [s.key for s in sources])
    snapshots = {t.qualified: backfill_asset_key(t, tr) for t in pipeline.tables}
    sink_keys = {s.name: tr.sink_key(s.name) for s in pipeline.sinks}
    sink_assets = [
        build_sink_asset(s, sink_keys[s.name], [log_key, *(snapshots[t] for t in s.tables if t in snapshots)],
                         tr.sink_metadata(s))
        for s in pipeline.sinks]
    drain_job = build_drain_job(log_key)
    delivery_jobs = [build_delivery_job(s, sink_keys[s.name]) for s in pipeline.sinks]
    backfill_assets, backfill_checks, backfill_jobs, backfill_schedules = backfill_definitions(pipeline, tr)
    api_assets, api_checks, api_jobs = api_sync_definitions(pipeline)
    return Definitions(
        assets=[*sources, change_log, *sink_assets, *backfill_assets, *api_assets],
        asset_checks=[*backfill_checks, *api_checks],
        jobs=[drain_job, *delivery_jobs, *backfill_jobs, *api_jobs, build_replay_job()],
        schedules=backfill_schedules,
        sensors=[build_drain_sensor(drain_job, log_key), build_delivery_sensor(delivery_jobs, sink_keys)],
        resources={
            "cdc": CdcConfigResource(config_path=path),
            "pyspark": pyspark_resource(pipeline),
            "sinks": SinksResource(config_path=path),
        },
    )
