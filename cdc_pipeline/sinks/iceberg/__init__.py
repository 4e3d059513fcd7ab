"""Apache Iceberg sink: a `mirror` or `append` table per source table, written through `pyiceberg`.

This package is the whole `iceberg` destination type: its config schema (here, light: loading a config never
imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from cdc_pipeline.config.base import StrictModel
from cdc_pipeline.sinks.base import Sink, SinkConfigLike
from cdc_pipeline.sinks.lake import LakeOptions


class IcebergCatalog(StrictModel):
    type: Literal["sql", "rest"] = Field(default="sql", description="`sql`: a SQL catalog (tables "
                                         "`iceberg_tables`, `iceberg_namespace_properties`); `rest`: a REST catalog.")
    uri: str | None = Field(default=None, description="`sql`: a PostgreSQL DSN or SQLAlchemy URL (null: the state "
                            "database, in the state schema); `rest`: the catalog's URL (required).")
    name: str = Field(default="cdc_pipeline", min_length=1, description="The catalog's name (a SQL catalog keeps "
                      "several apart by it).")
    properties: dict[str, str] = Field(default_factory=dict, description="More pyiceberg catalog and FileIO "
                                       "properties (`token`, `s3.access-key-id: ${KEY}`, ...); never logged.")


class IcebergDestination(LakeOptions):
    type: Literal["iceberg"] = "iceberg"
    warehouse: str = Field(min_length=1, description="Directory or object-store URL (`s3://`, `gs://`, ...) new tables "
                           "are created under.")
    catalog: IcebergCatalog = Field(default_factory=IcebergCatalog, description="Where table metadata is committed.")


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.iceberg.client import IcebergSink

    return IcebergSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.iceberg.client import IcebergSink

    return IcebergSink
