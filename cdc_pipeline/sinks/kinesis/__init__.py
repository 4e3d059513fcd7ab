"""Amazon Kinesis Data Streams sink: each message a record of stream `stream_name` (or the stream a route
names), partition key = its group, sent with PutRecords.

This package is the whole `kinesis` destination type: its config schema (here, light: loading a config
never imports aiobotocore) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cdc_pipeline.sinks.aws import AwsConnection
from cdc_pipeline.sinks.aws.names import route_problem
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class KinesisDestination(AwsConnection):
    type: Literal["kinesis"] = "kinesis"
    stream_name: str | None = Field(default=None, description="Stream of records without a route (or `stream_arn`).")
    stream_arn: str | None = Field(default=None, description="The stream's ARN instead of `stream_name` (as in "
                                   "Sequin's config).")
    route_prefixes: list[str] | None = Field(default=None, description="A route (a stream name in the same account "
                                             "and region) must start with one of these; none: any stream name.")

    @field_validator("stream_name")
    @classmethod
    def _check_stream(cls, value: str | None) -> str | None:
        problem = route_problem("stream", value, None)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("stream_arn")
    @classmethod
    def _check_arn(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("arn:") or ":stream/" not in value):
            raise ValueError("must be a stream ARN: arn:aws:kinesis:REGION:ACCOUNT:stream/NAME")
        return value

    @model_validator(mode="after")
    def _one_stream(self) -> "KinesisDestination":
        if (self.stream_name is None) == (self.stream_arn is None):
            raise ValueError("set one of stream_name and stream_arn")
        return self


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.kinesis.client import KinesisSink

    return KinesisSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.kinesis.client import KinesisSink

    return KinesisSink
