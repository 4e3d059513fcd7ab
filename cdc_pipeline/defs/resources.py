"""Dagster resources: the pipeline config, the sinks, the Spark session built from it, and the two that
run the work (defs/drain_run.py `DrainResource`, defs/delivery_run.py `DeliveryResource`), as
dagster-dlt's `DagsterDltResource` runs a pipeline: the streaming assets' bodies are one line each."""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import PrivateAttr
from pyspark.sql import SparkSession

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.delivery.spark_stage import prepare_environment, spark_session
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import Sink


class CdcConfigResource(ConfigurableResource):
    """Where the cdc.yaml is; loaded once per run (or sensor tick, or check), as the file is then."""

    config_path: str
    _loaded: PipelineConfig | None = PrivateAttr(default=None)

    def load(self) -> PipelineConfig:
        if self._loaded is None:  # Dagster builds the resource afresh for each run
            config = load_config(self.config_path)
            config.check_dsns()
            self._loaded = config
        return self._loaded


class SinksResource(ConfigurableResource):
    """The configured sinks' destinations: what delivery writes through. One typed resource that builds
    a sink by name (a test can swap it for one that returns its own Sink)."""

    config_path: str

    def build(self, sink_name: str, pipeline: PipelineConfig | None = None) -> Sink:
        """`pipeline`: the config the caller loaded already (else the file is read)."""
        return build_sink((pipeline or load_config(self.config_path)).sink(sink_name))


class SparkResource(ConfigurableResource):
    """The Spark session, built at run time from the config file: `spark.conf` values (after ${VAR}
    interpolation they may hold secrets, e.g. an s3a secret key) never become resource defaults, which
    Dagster shows in its UI and stores in every run's snapshot. Only the file's path is in the snapshot."""

    config_path: str

    @property
    def spark_session(self) -> SparkSession:
        return self.session()

    def session(self, pipeline: PipelineConfig | None = None) -> SparkSession:
        """`pipeline`: the config the caller loaded already (else the file is read)."""
        return spark_session((pipeline or load_config(self.config_path)).spark)


def pyspark_resource(config: PipelineConfig) -> SparkResource:
    prepare_environment()
    assert config.path is not None, "the Dagster code location loads its config from a file"
    return SparkResource(config_path=config.path)
