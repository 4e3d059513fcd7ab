"""NATS JetStream sink: publish each message to a subject of a stream.

This package is the whole `nats` destination type: its config schema (here, light: loading a config
never imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from cdc_pipeline.config.base import StrictModel, url_with_scheme
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class NatsDestination(StrictModel):
    type: Literal["nats"] = "nats"
    url: str = Field(default="nats://127.0.0.1:4222", description="Server URL (`nats://`, `tls://`, `ws://`, "
                     "`wss://`).")
    subject: str = Field(default="cdc", min_length=1, description="Subject of messages without a route.")
    stream: str = Field(default="CDC", min_length=1, description="JetStream stream, created if missing with "
                        "subjects `<subject>` and `<subject>.>`; an existing one is left as is.")
    ack_timeout_ms: int = Field(default=5000, gt=0, description="A message whose PubAck does not arrive in time "
                                "fails.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return url_with_scheme(value, ("nats", "tls", "ws", "wss"))

    @field_validator("subject")
    @classmethod
    def _check_subject(cls, value: str) -> str:
        if any(c.isspace() for c in value) or "" in value.split("."):
            raise ValueError(f"must be dot-separated tokens without spaces (got {value!r})")
        return value

    @field_validator("stream")
    @classmethod
    def _check_stream(cls, value: str) -> str:
        if any(c.isspace() or c in ".*>/\\" for c in value):
            raise ValueError(f"must not contain spaces or any of . * > / \\ (got {value!r})")
        return value


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.nats.client import NatsSink

    return NatsSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.nats.client import NatsSink

    return NatsSink
