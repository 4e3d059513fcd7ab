"""HTTP pull sink: messages wait in the state database for consumers of `cdc-pipeline serve`.

This package is the whole `http_pull` destination type: its config schema (here, light: loading a config
never imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from cdc_pipeline.config.base import ENV_NAME_RE, StrictModel
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class HttpPullDestination(StrictModel):
    """Messages wait in the state database until a consumer pulls them from `cdc-pipeline serve`."""

    type: Literal["http_pull"] = "http_pull"
    token_env: str = Field(description="NAME of the environment variable holding the consumers' bearer token.")
    visibility_timeout_ms: int = Field(default=30000, gt=0, description="A received message not acked within "
                                       "this is handed out again.")
    max_deliveries: int | None = Field(default=None, gt=0, description="A message handed out this many times "
                                       "without an ack is parked; default: hand it out forever.")

    @field_validator("token_env")
    @classmethod
    def _check_token_env(cls, value: str) -> str:
        if not ENV_NAME_RE.match(value):
            # Deliberately does not echo the value: it is probably the token itself.
            raise ValueError("must be the NAME of an environment variable holding the token "
                             "(e.g. PULL_TOKEN), never the token itself")
        return value


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.http_pull.client import HttpPullSink

    return HttpPullSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.http_pull.client import HttpPullSink

    return HttpPullSink
