"""Sinks: one module per destination type, built from a sink's config."""

from __future__ import annotations

import os
from collections.abc import Mapping

from cdc_pipeline.sinks.base import Sink


def build_sink(sink_config: object, environ: Mapping[str, str] = os.environ) -> Sink:
    kind = sink_config.destination.type  # type: ignore[attr-defined]
    if kind == "postgres":
        from cdc_pipeline.sinks.postgres import PostgresSink

        return PostgresSink(sink_config)
    raise ValueError(f"unknown destination type {kind!r}")
