"""RabbitMQ sink: publish each message to an exchange with publisher confirms.

This package is the whole `rabbitmq` destination type: its config schema (here, light: loading a config
never imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from cdc_pipeline.config.base import StrictModel, url_with_scheme
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class RabbitMQDestination(StrictModel):
    type: Literal["rabbitmq"] = "rabbitmq"
    url: str = Field(default="amqp://guest:guest@127.0.0.1:5672/%2F", description="AMQP URL (`amqp://`, "
                     "`amqps://`).")
    exchange: str = Field(default="cdc", description="Exchange, declared durable on start.")
    exchange_type: Literal["topic", "direct", "fanout", "headers"] = Field(default="topic", description="The "
                                                                           "exchange's type.")
    routing_key: str = Field(default="cdc", description="Routing key of messages without a route.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return url_with_scheme(value, ("amqp", "amqps"))


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.rabbitmq.client import RabbitMQSink

    return RabbitMQSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.rabbitmq.client import RabbitMQSink

    return RabbitMQSink
