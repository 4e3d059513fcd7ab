"""Sinks: one package per destination type (schema + client + capabilities), listed in
`config/destinations.py`.

A pipeline only imports the client library (psycopg, httpx, redis, nats-py, pika, pyarrow) of the
destinations it actually uses: each package's `build` imports its client.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cdc_pipeline.config.destinations import DESTINATION_TYPES, SINK_TYPES, sink_package
from cdc_pipeline.sinks.base import Sink, SinkConfigLike, SinkContext

if TYPE_CHECKING:
    from cdc_pipeline.config import PipelineConfig, SinkConfig


def sink_class(sink_config: SinkConfigLike) -> type[Sink]:
    """The `Sink` class of the sink's destination type: ask it for the sink's capabilities (sinks/base.py)
    without building a client."""
    _known(sink_config)
    cls: type[Sink] = sink_package(sink_config.destination.type).sink_class()
    return cls


def _known(sink_config: SinkConfigLike) -> None:
    kind = sink_config.destination.type
    if kind not in SINK_TYPES:
        raise ValueError(f"sink {sink_config.name!r}: unknown destination type {kind!r} "
                         f"(expected one of {', '.join(DESTINATION_TYPES)})")


def build_sink(sink_config: SinkConfigLike, environ: Mapping[str, str] = os.environ,
               context: SinkContext | None = None) -> Sink:
    """The sink for `sink_config.destination.type`; `environ` supplies secrets named in the config, `context`
    what the delivery that runs it gives it (sinks/base.py `SinkContext`)."""
    _known(sink_config)
    sink: Sink = sink_package(sink_config.destination.type).build(sink_config, environ)
    if context is not None:
        sink.context = context
    return sink


def takes_typed(config: PipelineConfig, sink: SinkConfig, sink_type: type[Sink] | None = None) -> bool:
    """Whether backfill reads reach the sink as typed rows (and in relayed runs): its type writes them as they
    are (`takes_typed_rows`) and its messages need no record (no filter, transform, route or grouping by
    columns; delivery/spark_stage.py `needs_record`), on a change stream. The one decision, asked by a backfill
    of the config's sink type and by delivery of the sink it built."""
    if not (sink_type or sink_class(sink)).takes_typed_rows(sink):
        return False
    grouped = sink.message_grouping and any(t.group_columns for t in config.tables if t.qualified in sink.tables)
    return sink.stream == "changes" and not (sink.filter or sink.transform or sink.route or grouped)
