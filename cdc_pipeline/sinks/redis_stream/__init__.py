"""Redis Streams sink: XADD each message to a stream.

This package is the whole `redis_stream` destination type: its config schema (here, light: loading a config
never imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from cdc_pipeline.config.base import StrictModel, url_with_scheme
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class RedisStreamDestination(StrictModel):
    type: Literal["redis_stream"] = "redis_stream"
    url: str = Field(default="redis://127.0.0.1:6379/0", description="`redis://`, `rediss://` or `unix://` URL.")
    stream_key: str = Field(default="cdc", min_length=1, description="Stream receiving messages without a route.")
    maxlen: int | None = Field(default=None, gt=0, description="Approximate cap on the stream's length "
                               "(`MAXLEN ~`); default: none.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return url_with_scheme(value, ("redis", "rediss", "unix"))


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.redis_stream.client import RedisStreamSink

    return RedisStreamSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.redis_stream.client import RedisStreamSink

    return RedisStreamSink
