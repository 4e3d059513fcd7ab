"""Sinks: one package per destination type (schema + client + capabilities), listed in
`config/destinations.py`.

A pipeline only imports the client library (psycopg, httpx, redis, nats-py, pika, pyarrow) of the
destinations it actually uses: each package's `build` imports its client.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cdc_pipeline.config.destinations import DESTINATION_TYPES, SINK_TYPES, sink_package
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


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


def build_sink(sink_config: SinkConfigLike, environ: Mapping[str, str] = os.environ) -> Sink:
    """The sink for `sink_config.destination.type`; `environ` supplies secrets named in the config."""
    _known(sink_config)
    sink: Sink = sink_package(sink_config.destination.type).build(sink_config, environ)
    return sink
