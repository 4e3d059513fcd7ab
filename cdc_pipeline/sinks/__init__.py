"""Sinks: one package per destination type (schema + client), listed in `config/destinations.py`.

A pipeline only imports the client library (psycopg, httpx, redis, nats-py, pika, pyarrow) of the
destinations it actually uses: each package's `build` imports its client.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cdc_pipeline.config.destinations import DESTINATION_TYPES, SINK_TYPES, sink_package
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


def build_sink(sink_config: SinkConfigLike, environ: Mapping[str, str] = os.environ) -> Sink:
    """The sink for `sink_config.destination.type`; `environ` supplies secrets named in the config."""
    kind = sink_config.destination.type
    if kind not in SINK_TYPES:
        raise ValueError(f"sink {sink_config.name!r}: unknown destination type {kind!r} "
                         f"(expected one of {', '.join(DESTINATION_TYPES)})")
    sink: Sink = sink_package(kind).build(sink_config, environ)
    return sink
