"""The metrics port of a long-lived Dagster run (`metrics.run_ports_from`, map in core/run_ports.py): the same
OpsServer and collector as the CLI verb doing the same work, bound once the port is free.

Why not bind at once: the sensor may start a job's next run while the previous one is still stopping (a
handover, or a restart after a failure), and that one holds the port until its process ends. A busy port
must not fail the run, so a background thread retries the bind with capped backoff and says once what it
waits for; the work streams meanwhile. `stop` ends the thread and closes the socket.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from typing import Any

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.metrics_registry import REGISTRY
from cdc_pipeline.ops.health import Check, OpsServer, register_pipeline_metrics

FIRST_RETRY_SECONDS = 0.1
MAX_RETRY_SECONDS = 2.0  # a freed port is taken within this: a successor's gap in scrapes stays short


class RunOpsServer:
    """``say``: where the run tells what it serves or waits for (the Dagster run's log), once each."""

    def __init__(self, config: PipelineConfig, port: int, runners: Callable[[], list[Any]], ready: list[Check],
                 say: Callable[[str], None]) -> None:
        self.host, self.port, self.say = config.metrics.host, port, say
        self.address = f"{self.host}:{port}"
        self.collector, self.checks = register_pipeline_metrics(config, runners, ready)
        self.server: OpsServer | None = None
        self.attempts = 0  # binds tried
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._bind_when_free, name=f"ops-bind-{port}", daemon=True)

    def start(self) -> RunOpsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        if self.server is not None:
            self.server.stop()  # unregisters the collector
        else:
            REGISTRY.unregister(self.collector)

    def _bind_when_free(self) -> None:
        delay, started, told = FIRST_RETRY_SECONDS, time.monotonic(), set[int]()
        while not self._stopping.is_set():
            self.attempts += 1
            try:
                server = OpsServer(self.host, self.port, live=[], ready=self.checks, registered=self.collector)
            except OSError as exc:
                if (exc.errno or 0) not in told:  # once per cause, not per try
                    told.add(exc.errno or 0)
                    self.say(_waiting_for(self.address, exc))
                self._stopping.wait(delay)
                delay = min(MAX_RETRY_SECONDS, delay * 2)
                continue
            self.server = server.start()
            waited = time.monotonic() - started
            self.say(f"metrics and health of this run on {self.address}: http://{self.address}/metrics, "
                     f"/healthz, /readyz" + (f" (bound after waiting {waited:.1f} s)" if told else ""))
            return


def _waiting_for(address: str, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"metrics port {address} is in use (the previous run of this job still stopping?): serving "
                "/metrics, /healthz, /readyz there once it is free")
    return f"cannot serve metrics on {address} yet ({exc.strerror or exc}): retrying until the run ends"


def start_run_ops(config: PipelineConfig, port: int | None, runners: Callable[[], list[Any]],
                  ready: list[Check], say: Callable[[str], None]) -> RunOpsServer | None:
    """The run's metrics server on ``port`` (ops/run_ports.run_port), None when off. Never raises for the
    port: a run's work matters more than its metrics."""
    if port is None:
        return None
    try:
        return RunOpsServer(config, port, runners, ready, say).start()
    except ValueError as exc:  # the collector already registered: another run in this process serves it
        say(f"no metrics for this run on {config.metrics.host}:{port}: {exc}")
        return None
