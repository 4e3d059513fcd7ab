"""Dagster resources: the pipeline config, the sinks, and the Spark session built from it."""

from __future__ import annotations

from dagster import ConfigurableResource, Definitions
from pyspark.sql import SparkSession

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.delivery.spark_stage import prepare_environment, spark_session
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


class SparkResource(ConfigurableResource):
    """The Spark session, built at run time from the config file: `spark.conf` values (after ${VAR}
    interpolation they may hold secrets, e.g. an s3a secret key) never become resource defaults, which
    Dagster shows in its UI and stores in every run's snapshot. Only the file's path is in the snapshot."""

    config_path: str

    @property
    def spark_session(self) -> SparkSession:
        return spark_session(load_config(self.config_path).spark)


def pyspark_resource(config: PipelineConfig) -> SparkResource:
    prepare_environment()
    assert config.path is not None, "the Dagster code location loads its config from a file"
    return SparkResource(config_path=config.path)


def resource_definitions(config: PipelineConfig) -> Definitions:
    """`cdc` (the config), `pyspark` (the Spark session) and `sinks`: what every area's assets and ops use."""
    assert config.path is not None, "the Dagster code location loads its config from a file"
    return Definitions(resources={"cdc": CdcConfigResource(config_path=config.path),
                                  "pyspark": pyspark_resource(config),
                                  "sinks": SinksResource(config_path=config.path)})
