"""A long-lived run's metrics port (`metrics.run_ports_from`): served while the run streams, stopped when its
work ends; where it is (or what it waits for) goes to the run's log once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.ops.health import Check
from cdc_pipeline.ops.run_server import start_run_ops


@contextmanager
def run_metrics(log: Any, pipeline: PipelineConfig, port: int | None, runners: Callable[[], list[Any]],
                ready: list[Check]) -> Iterator[None]:
    """``log``: the run's (context.log); ``port``: ops/run_ports.run_port for this run, None when off."""
    server = start_run_ops(pipeline, port, runners, ready, log.info)
    try:
        yield
    finally:
        if server is not None:
            server.stop()
