"""Dagster resources: the pipeline config, and the Spark session built from it."""

from __future__ import annotations

from dagster import ConfigurableResource
from dagster_pyspark import PySparkResource

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.delivery.spark_stage import prepare_environment, spark_conf
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import Sink


class CdcConfigResource(ConfigurableResource):
    """Where the cdc.yaml is; loaded per use so a run sees the file as it is when it starts."""

    config_path: str

    def load(self) -> PipelineConfig:
        return load_config(self.config_path)


class SinkResource(ConfigurableResource):
    """One sink's destination as a Dagster resource: listed in the UI, and what delivery writes through."""

    config_path: str
    sink_name: str

    def build(self) -> Sink:
        return build_sink(load_config(self.config_path).sink(self.sink_name))


def sink_resource_key(sink_name: str) -> str:
    return f"sink_{sink_name.replace('-', '_')}"


def pyspark_resource(config: PipelineConfig) -> PySparkResource:
    prepare_environment()
    return PySparkResource(spark_config=spark_conf(config.spark))
