"""Parquet sink: Spark writes each batch as Parquet files under `path`.

This package is the whole `parquet` destination type: its config schema (here, light: loading a config
never imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from cdc_pipeline.config.base import StrictModel
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class ParquetDestination(StrictModel):
    type: Literal["parquet"] = "parquet"
    path: str = Field(min_length=1, description="Directory or Hadoop filesystem URI (`file://`, `hdfs://`, "
                      "`s3a://`, ...) that Spark writes each batch under.")


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.parquet.client import ParquetSink

    return ParquetSink(sink_config)  # type: ignore[no-any-return,unused-ignore]


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.parquet.client import ParquetSink

    return ParquetSink
