"""Sinks: one module per destination type, built from a sink's config.

Imports are lazy so a pipeline only loads the client library (psycopg, httpx, redis, nats-py, pika,
pyarrow) of the destinations it actually uses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cdc_pipeline.sinks.base import Sink, SinkConfigLike

DESTINATION_TYPES = ("postgres", "webhook", "redis_stream", "nats", "rabbitmq", "parquet", "http_pull")


def build_sink(sink_config: SinkConfigLike, environ: Mapping[str, str] = os.environ) -> Sink:
    """The sink for `sink_config.destination.type`; `environ` supplies secrets named in the config."""
    kind = sink_config.destination.type
    if kind == "postgres":
        from cdc_pipeline.sinks.postgres import PostgresSink

        return PostgresSink(sink_config)
    if kind == "webhook":
        from cdc_pipeline.sinks.webhook import WebhookSink

        return WebhookSink(sink_config, environ=environ)
    if kind == "redis_stream":
        from cdc_pipeline.sinks.redis_stream import RedisStreamSink

        return RedisStreamSink(sink_config)
    if kind == "nats":
        from cdc_pipeline.sinks.nats import NatsSink

        return NatsSink(sink_config)
    if kind == "rabbitmq":
        from cdc_pipeline.sinks.rabbitmq import RabbitMQSink

        return RabbitMQSink(sink_config)
    if kind == "parquet":
        from cdc_pipeline.sinks.parquet import ParquetSink  # type: ignore[import-not-found,unused-ignore]

        return ParquetSink(sink_config)  # type: ignore[no-any-return,unused-ignore]
    if kind == "http_pull":
        from cdc_pipeline.sinks.http_pull import HttpPullSink

        return HttpPullSink(sink_config)
    raise ValueError(f"sink {sink_config.name!r}: unknown destination type {kind!r} "
                     f"(expected one of {', '.join(DESTINATION_TYPES)})")
