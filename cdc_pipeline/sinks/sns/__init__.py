"""Amazon SNS sink: each message published to topic `topic_arn` (or the topic a route names) with
PublishBatch.

This package is the whole `sns` destination type: its config schema (here, light: loading a config never
imports aiobotocore) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from cdc_pipeline.sinks.aws import AwsConnection
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class SnsDestination(AwsConnection):
    type: Literal["sns"] = "sns"
    topic_arn: str = Field(min_length=1, description="ARN of the topic of messages without a route; a FIFO topic "
                           "(name ending `.fifo`) keeps each group's order.")
    route_prefixes: list[str] | None = Field(default=None, description="A route (a topic name in the same account "
                                             "and region) must start with one of these; none: any topic name.")

    @field_validator("topic_arn")
    @classmethod
    def _check_arn(cls, value: str) -> str:
        parts = value.split(":")
        if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sns" or not parts[5]:
            raise ValueError("must be a topic ARN: arn:aws:sns:REGION:ACCOUNT:NAME")
        return value


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.sns.client import SnsSink

    return SnsSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.sns.client import SnsSink

    return SnsSink
