"""The webhook window under `cdc-pipeline deliver` (issue 23): SIGKILLed with a full window of requests
outstanding (within one call, or across calls of one message each), the committed offset has not passed any
of them, and a restart delivers every message (at least once), each group's first acknowledgements in
commit order."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import yaml

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests import helpers
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import wait_until
from cdc_pipeline_tests.integration.admin.test_cli_errors import CLI
from cdc_pipeline_tests.integration.delivery.test_delivery_outage import _config, _log
from cdc_pipeline_tests.integration.sinks.test_webhook_window import Counting

ROWS = 100
WINDOW = 50


def _offset(config: PipelineConfig) -> tuple[int, int]:
    with psycopg.connect(config.state_dsn) as conn:
        row = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.sink_offsets WHERE sink = 'hook'").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, -1)


def answer_then_hold(first: int, release: threading.Event, then: int = 200
                     ) -> tuple[Callable[[dict[str, str], bytes], tuple[int, bytes, float]], dict[str, int]]:
    """A receiver's behaviour: the first ``first`` requests answered 200 at once, every later one held
    until ``release`` and then answered ``then``; and the count of requests received (``["n"]``)."""
    answered = {"n": 0}
    lock = threading.Lock()

    def behaviour(h: dict[str, str], b: bytes) -> tuple[int, bytes, float]:
        with lock:
            answered["n"] += 1
            hold = answered["n"] > first
        if not hold:
            return 200, b"{}", 0.0
        release.wait(300)
        return then, (b"{}" if then < 300 else b"gone"), 0.0

    return behaviour, answered


def _position(key: str) -> tuple[int, int]:
    lsn, _, idx = key.partition(":")
    return int(lsn), int(idx)


@pytest.mark.parametrize("calls", ["one per block", "one per message"])
def test_sigkill_with_a_full_window_outstanding_loses_nothing(
        source_db: Database, write_config: Callable[..., PipelineConfig], calls: str) -> None:
    """"one per block": the webhook's own window within a call (a request per message, blocks of 100);
    "one per message": the sink's `batch_size: 1`, so the engine's window across calls does the work."""
    receiver = Counting()
    try:
        if calls == "one per block":
            config = _config(source_db, write_config, receiver.url,
                             destination={"batch_size": 1, "max_in_flight": WINDOW, "timeout_ms": 120000})
            data = yaml.safe_load(Path(config.path).read_text())
            data["delivery"]["batch_size"] = 100  # three batches: one settled, one in the window, one waiting
            Path(config.path).write_text(yaml.safe_dump(data))
        else:
            config = _config(source_db, write_config, receiver.url, batch_size=1,
                             destination={"max_in_flight": WINDOW, "timeout_ms": 120000})
        source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, %s) g", (ROWS,))
        source_db.execute("UPDATE t SET v = 1")
        source_db.execute("UPDATE t SET v = 2")
        helpers.drain(config)
        log = _log(config)
        assert len(log) == 3 * ROWS

        release = threading.Event()
        # Outstanding until the test lets go, and never an acknowledgement: its sender is dead by then.
        receiver.behaviour, answered = answer_then_hold(150, release, 503)
        proc = subprocess.Popen([CLI, "--config", str(config.path), "deliver", "--sink", "hook", "--seconds", "600"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            wait_until(lambda: answered["n"] >= 150 + WINDOW, 240, "a full window of requests outstanding")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            release.set()
        offset = _offset(config)  # what the killed process left committed: what a restart starts from
        acked = set(receiver.acked_keys())
        assert len(acked) == 150
        # The offset never passes a message that was not acknowledged (nor parked: nothing is).
        assert all(k in acked for k, _ in log if _position(k) <= offset), offset
        assert answered["n"] == 150 + WINDOW  # the window held: no request beyond it went out

        receiver.behaviour = lambda h, b: (200, b"{}", 0.0)
        done = subprocess.run([CLI, "--config", str(config.path), "deliver", "--sink", "hook", "--until-idle"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        acks = receiver.acked_keys()
        assert set(acks) == {k for k, _ in log}  # nothing missing (some twice: at least once)
        first: dict[int, list[str]] = {}
        row_of = dict(log)
        for k in dict.fromkeys(acks):  # first acknowledgement of each message, in arrival order
            first.setdefault(row_of[k], []).append(k)
        for row, got in first.items():
            assert got == [k for k, r in log if r == row], f"row {row} first arrived out of order: {got}"
        assert _offset(config) == _position(log[-1][0])
    finally:
        receiver.stop()
