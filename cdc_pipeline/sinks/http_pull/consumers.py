"""The consumers of `cdc-pipeline serve`: the config's http_pull sinks, with their tokens (consumers/app.py
serves them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.sinks.base import SinkConfigError
from cdc_pipeline.sinks.http_pull import HttpPullDestination

__all__ = ["Consumer", "consumers_of"]


@dataclass(frozen=True)
class Consumer:
    name: str
    token: str
    visibility_timeout_ms: int
    max_deliveries: int | None


def consumers_of(config: PipelineConfig, environ: Mapping[str, str] = os.environ) -> dict[str, Consumer]:
    """The http_pull sinks of the config, with their tokens read from the environment."""
    out: dict[str, Consumer] = {}
    for sink in config.sinks:
        dest = sink.destination
        if not isinstance(dest, HttpPullDestination):
            continue
        token = environ.get(dest.token_env)
        if not token:
            raise SinkConfigError(f"http_pull sink {sink.name!r}: environment variable {dest.token_env} "
                                  "(token_env) is not set")
        out[sink.name] = Consumer(sink.name, token, dest.visibility_timeout_ms, dest.max_deliveries)
    return out
