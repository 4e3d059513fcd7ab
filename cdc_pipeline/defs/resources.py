"""Dagster resources: the pipeline config, the sinks, and the Spark session built from it."""

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
        config = load_config(self.config_path)
        config.check_dsns()
        return config


class SinksResource(ConfigurableResource):
    """The configured sinks' destinations: what delivery writes through. One typed resource that builds
    a sink by name (a test can swap it for one that returns its own Sink)."""

    config_path: str

    def build(self, sink_name: str) -> Sink:
        return build_sink(load_config(self.config_path).sink(sink_name))


def pyspark_resource(config: PipelineConfig) -> PySparkResource:
    prepare_environment()
    return PySparkResource(spark_config=spark_conf(config.spark))
