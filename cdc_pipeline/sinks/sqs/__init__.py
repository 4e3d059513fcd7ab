"""Amazon SQS sink: each message a message of queue `queue_url` (or the queue a route names), sent with
SendMessageBatch.

This package is the whole `sqs` destination type: its config schema (here, light: loading a config never
imports aiobotocore) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from cdc_pipeline.config.base import url_with_scheme
from cdc_pipeline.sinks.aws import AwsConnection
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class SqsDestination(AwsConnection):
    type: Literal["sqs"] = "sqs"
    queue_url: str = Field(min_length=1, description="URL of the queue of messages without a route; a FIFO queue "
                           "(name ending `.fifo`) keeps each group's order.")
    route_prefixes: list[str] | None = Field(default=None, description="A route (a queue name in the same account "
                                             "and region) must start with one of these; none: any queue name.")

    @field_validator("queue_url")
    @classmethod
    def _check_queue_url(cls, value: str) -> str:
        return url_with_scheme(value, ("http", "https"))


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.sqs.client import SqsSink

    return SqsSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.sqs.client import SqsSink

    return SqsSink
