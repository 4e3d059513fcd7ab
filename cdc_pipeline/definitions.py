"""The Dagster code location: `workspace.yaml` loads `defs` from here.

The pipeline config is read from $CDC_CONFIG (or ./cdc.yaml); every table and sink in it becomes
assets, jobs and sensors.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import Definitions

from cdc_pipeline.config import CONFIG_ENV_VAR, ConfigError, PipelineConfig, load_config
from cdc_pipeline.defs.capture import build_drain_sensor, change_log_asset
from cdc_pipeline.defs.delivery import build_delivery_asset, build_delivery_job, build_delivery_sensor
from cdc_pipeline.defs.resources import CdcConfigResource, pyspark_resource


def config_path() -> str:
    path = os.environ.get(CONFIG_ENV_VAR) or ("cdc.yaml" if Path("cdc.yaml").exists() else None)
    if path is None:
        raise ConfigError(f"no pipeline config: set {CONFIG_ENV_VAR} to the path of your cdc.yaml")
    return str(Path(path).resolve())


def build_definitions(path: str) -> Definitions:
    pipeline: PipelineConfig = load_config(path)
    jobs = [build_delivery_job(s) for s in pipeline.sinks]
    return Definitions(
        assets=[change_log_asset, *(build_delivery_asset(s) for s in pipeline.sinks)],
        jobs=jobs,
        sensors=[build_drain_sensor(jobs), build_delivery_sensor()],
        resources={"cdc": CdcConfigResource(config_path=path), "pyspark": pyspark_resource(pipeline)},
    )


defs = build_definitions(config_path())
