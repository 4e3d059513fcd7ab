"""The metrics port of one long-lived Dagster run, from its config (the map: core/run_ports.py)."""

from __future__ import annotations

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.run_ports import run_port_map


def run_port(config: PipelineConfig, sink: str | None = None, lane: int = 0) -> int | None:
    """The port of the drain run (no ``sink``) or of a sink lane's delivery run; None when off."""
    first = config.metrics.run_ports_from
    if first is None:
        return None
    return run_port_map(first, [(s.name, s.lanes) for s in config.sinks]).get((sink, lane))
