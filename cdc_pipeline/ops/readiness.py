"""The /readyz checks of the drain and of deliverers, shared by the CLI verbs and the Dagster runs doing
the same work, so both answer alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdc_pipeline.ops.health import Check


def drain_streaming(drain: Any) -> Check:
    """Ready while the drain streams; otherwise its phase (connecting, taking the lock, ...)."""
    return lambda: None if drain._phase == "streaming" else f"drain: {drain._phase}"


def deliverers_not_waiting(deliverers: Callable[[], list[Any]]) -> Check:
    """Not ready while a sink waits on an outage (the reason is the sink's)."""
    def check() -> str | None:
        waits = [f"sink {d.sink_config.name} waiting: {d.stats.waiting}" for d in deliverers()
                 if d.stats is not None and d.stats.waiting]
        return "; ".join(waits) or None

    return check
