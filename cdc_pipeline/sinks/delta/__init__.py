"""Delta Lake sink: a `mirror` or `append` table per source table, written through delta-rs (`deltalake`).

This package is the whole `delta` destination type: its config schema (here, light: loading a config never
imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from cdc_pipeline.sinks.base import Sink, SinkConfigLike
from cdc_pipeline.sinks.lake import LakeOptions


class DeltaDestination(LakeOptions):
    type: Literal["delta"] = "delta"
    path: str = Field(min_length=1, description="Directory or object-store URL (`s3://`, `gs://`, `az://`, ...) the "
                      "tables are kept under: a table at `<path>/<table>`.")
    storage_options: dict[str, str] = Field(default_factory=dict, description="delta-rs storage options (e.g. "
                                            "`AWS_ACCESS_KEY_ID: ${AWS_ACCESS_KEY_ID}`); never logged.")


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.delta.client import DeltaSink

    return DeltaSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.delta.client import DeltaSink

    return DeltaSink
