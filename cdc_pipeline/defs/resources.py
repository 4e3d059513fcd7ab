"""Dagster resources: the pipeline config, and the Spark session built from it."""

from __future__ import annotations

from dagster import ConfigurableResource
from dagster_pyspark import PySparkResource

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.delivery.spark_stage import spark_conf


class CdcConfigResource(ConfigurableResource):
    """Where the cdc.yaml is; loaded per use so a run sees the file as it is when it starts."""

    config_path: str

    def load(self) -> PipelineConfig:
        return load_config(self.config_path)


def pyspark_resource(config: PipelineConfig) -> PySparkResource:
    return PySparkResource(spark_config=spark_conf(config.spark))
