"""A Dagster run's metrics server (ops/run_server.py) on a port another process still holds: it waits without
failing (saying so once, not per try), binds once the port is released, serves what the CLI serves, and
leaves no thread or socket when stopped."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.demo.dagster_dev import free_port
from cdc_pipeline.ops.health import OpsServer
from cdc_pipeline.ops.run_server import start_run_ops
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config, wait_until
from cdc_pipeline_tests.integration.ops.test_metrics import _get, _scrape


def _ops_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ops-")]


def _bindable(port: int) -> bool:
    """Nobody listens there (as a server binds: the scrapes' closed connections may linger in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _config(source_db: Database, db_factory: Callable[[], Database],
            write_config: Callable[..., PipelineConfig]) -> PipelineConfig:
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(mirror_config(source_db.dsn, db_factory().dsn, ["public.t"]))
    setup(config)
    return config


def test_a_busy_port_is_waited_for_then_bound_once_released(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(source_db, db_factory, write_config)
    port = free_port()
    predecessor = OpsServer("127.0.0.1", port, live=[], ready=[lambda: "the predecessor"]).start()
    said: list[str] = []
    server = start_run_ops(config, port, lambda: [], [], said.append)
    assert server is not None
    try:
        wait_until(lambda: server.attempts >= 4, 30, "several binds tried while the port is busy")
        assert server.server is None
        assert said == [f"metrics port 127.0.0.1:{port} is in use (the previous run of this job still stopping?): "
                        "serving /metrics, /healthz, /readyz there once it is free"]  # once, not per try
        assert _get(port, "/readyz") == (503, "not ready: the predecessor\n")  # still the predecessor's

        predecessor.stop()
        wait_until(lambda: server.server is not None, 30, "the port bound once released")
        assert len(said) == 2 and said[1].startswith(
            f"metrics and health of this run on 127.0.0.1:{port}: http://127.0.0.1:{port}/metrics, /healthz, "
            "/readyz (bound after waiting "), said
        assert _get(port, "/healthz") == (200, "ok\n")
        assert _get(port, "/readyz") == (200, "ok\n")  # this run's checks now: the state database answers
        scraped = {name for name, _ in _scrape(port)}
        assert {"cdc_sink_lag_messages", "cdc_slot_lag_bytes", "cdc_slot_active"} <= scraped  # status's figures
    finally:
        server.stop()
        predecessor.stop()
    assert _ops_threads() == [] and _bindable(port)
    assert _get(port, "/healthz")[0] == 0  # nobody answers


def test_stopped_while_waiting_leaves_nothing_and_a_next_run_in_the_process_can_serve(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(source_db, db_factory, write_config)
    port = free_port()
    with socket.socket() as holder:  # a process that holds the port and never lets go
        holder.bind(("127.0.0.1", port))
        holder.listen()
        said: list[str] = []
        server = start_run_ops(config, port, lambda: [], [], said.append)
        assert server is not None
        wait_until(lambda: server.attempts >= 2, 30, "binds tried")
        server.stop()
        assert server.server is None and _ops_threads() == [] and len(said) == 1
    # The collector was unregistered: another run in this process serves its metrics.
    again = start_run_ops(config, port, lambda: [], [], said.append)
    assert again is not None
    try:
        wait_until(lambda: _get(port, "/healthz")[0] == 200, 30, "the next run's server")
    finally:
        again.stop()
    assert _ops_threads() == [] and _bindable(port)
