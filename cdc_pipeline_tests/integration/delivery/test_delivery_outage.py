"""Outage versus poison under a long-running delivery, against a real local HTTP endpoint.

A destination that is down (503 for everyone, or timing out on everything) is waited for: the same
delivery keeps running, parks nothing, counts nothing against `max_retries`, says so in `status`, and
when the endpoint comes back every version of every row arrives in order. A message the endpoint rejects
(or times out on) while it accepts others is still that message's failure: parked, then discarded.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin import status
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.engine import Deliverer, DeliveryStats
from cdc_pipeline_tests import helpers
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import wait_until
from cdc_pipeline_tests.integration.admin.test_cli_errors import CLI
from cdc_pipeline_tests.integration.sinks.test_sink_webhook import Receiver


class Background(threading.Thread):
    """Runs a long-running drain or delivery; keeps its result or error."""

    def __init__(self, target: Callable[[], Any], stop: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self._target_fn, self.stop = target, stop
        self.result: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self) -> Any:
        self.stop()
        self.join(60)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def _config(source_db: Database, write_config: Callable[..., PipelineConfig], url: str,
            **sink: Any) -> PipelineConfig:
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "outage", "publication": "outage"},
        "spark": {"master": "local[2]"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 100},
        "delivery": {"idle_seconds": 0.1, "retry_initial_ms": 100, "retry_max_ms": 800},
        "tables": [{"name": "public.t"}],
        "sinks": [{"name": "hook", "tables": ["public.t"],
                   "backoff": {"initial_ms": 50, "max_ms": 200, "jitter": 0},
                   "destination": {"type": "webhook", "url": url, **sink.pop("destination", {})}, **sink}],
    })
    setup(config)
    return config


def _log(config: PipelineConfig) -> list[tuple[str, int]]:
    """(idempotency key, row id) of every change in the log, in commit order."""
    with psycopg.connect(config.state_dsn) as conn:
        return [(f"{lsn}:{idx}", int(row)) for lsn, idx, row in conn.execute(
            "SELECT commit_lsn, commit_idx, record->>'id' FROM cdc_pipeline.change_log "
            "ORDER BY commit_lsn, commit_idx")]


def _failed(config: PipelineConfig) -> list[tuple[int, str, int, str]]:
    with psycopg.connect(config.state_dsn) as conn:
        return conn.execute("SELECT (c.record->>'id')::int, f.status, f.attempts, f.last_error "
                            "FROM cdc_pipeline.failed_messages f JOIN cdc_pipeline.change_log c "
                            "USING (commit_lsn, commit_idx) ORDER BY 1, f.commit_lsn").fetchall()


def _answered(receiver: Receiver, code: int) -> int:
    with receiver.lock:
        return sum(1 for _, _, status_ in receiver.requests if status_ == code)


def _start(config: PipelineConfig, spark: Any) -> tuple[Background, Background]:
    drain = Drain(config)
    deliverer = Deliverer(config, config.sink("hook"), spark)
    return (Background(lambda: drain.run(), drain.stop),
            Background(lambda: deliverer.run(until_idle=False), deliverer.stop))


# The sink's own batch_size of 1: a call per message, many out at once (the engine's window across calls).
CALLS = pytest.mark.parametrize("calls", [{}, {"batch_size": 1}], ids=["calls per block", "a call per message"])


@CALLS
def test_destination_down_is_waited_for_not_counted(source_db: Database, write_config: Callable[..., PipelineConfig],
                                                    spark: Any, receiver: Receiver, calls: dict[str, int]) -> None:
    # max_retries 0: a single failure counted against any message would discard it at once.
    config = _config(source_db, write_config, receiver.url, max_retries=0,
                     destination={"batch_size": 5, "timeout_ms": 300}, **calls)
    drain, deliver = _start(config, spark)
    try:
        source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 20) g")
        wait_until(lambda: len(receiver.acked_keys()) == 20, 60, "the inserts")

        # 1. The endpoint answers 503 to everything.
        receiver.behaviour = lambda h, b: (503, b"maintenance", 0.0)
        for v in (1, 2):
            source_db.execute("UPDATE t SET v = %s", (v,))
        wait_until(lambda: len(_log(config)) == 60, 60, "the drain")
        # Several attempts refused (the batch retried with backoff, not parked after the first one).
        wait_until(lambda: _answered(receiver, 503) >= 4, 120, "four refused attempts")
        wait_until(lambda: status.collect(config)["sinks"]["hook"]["waiting_for_destination"], 60, "status")
        assert deliver.is_alive(), deliver.error
        assert _failed(config) == []
        sink = status.collect(config)["sinks"]["hook"]
        assert sink["waiting_for_destination"] and "503" in sink["waiting_for_destination"], sink
        assert "waiting for the destination" in status.render(status.collect(config))

        # 2. Then it times out on everything: per-message "unreachable" errors, still an outage.
        slow_from = len(receiver.requests)
        receiver.behaviour = lambda h, b: (200, b"{}", 0.6)
        source_db.execute("UPDATE t SET v = 3 WHERE id <= 10")
        wait_until(lambda: len(_log(config)) == 70, 60, "the drain")
        wait_until(lambda: len(receiver.requests) - slow_from >= 4, 120, "four timed-out attempts")
        assert deliver.is_alive(), deliver.error
        assert _failed(config) == []  # nothing parked, nothing counted, nothing discarded

        # 3. Back: every version of every row arrives, each row's versions in commit order.
        receiver.behaviour = lambda h, b: (200, b"{}", 0.0)
        logged = _log(config)
        wait_until(lambda: set(receiver.acked_keys()) >= {k for k, _ in logged}, 120, "recovery")
        wait_until(lambda: status.collect(config)["sinks"]["hook"]["waiting_for_destination"] is None, 60,
                   "status to stop saying it waits")
        stats: DeliveryStats = deliver.finish()
    finally:
        deliver.stop()
        drain.finish()
    assert stats.outage_retries >= 3 and stats.discarded == 0 and stats.parked == 0
    assert _failed(config) == []
    acked = receiver.acked_keys()
    for row in range(1, 21):  # per row: its versions in commit order (a timed-out request may repeat one)
        mine = [k for k, r in logged if r == row]
        seen = [k for k in dict.fromkeys(acked) if k in set(mine)]
        assert seen == mine, (row, seen, mine)
    bodies = [json.loads(b) for _, b, status_ in receiver.requests if status_ == 200]
    assert all(m["metadata"]["idempotency_key"] for body in bodies for m in body["data"])


@CALLS
def test_poison_next_to_healthy_messages_is_parked_and_discarded(
        source_db: Database, write_config: Callable[..., PipelineConfig], spark: Any, receiver: Receiver,
        calls: dict[str, int]) -> None:
    """Row 7 is rejected (500) and row 9 is timed out on, while every other message is accepted: both
    are that message's failure, counted against max_retries (1) and discarded; the rest all arrive."""
    def behaviour(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        ids = {m["record"]["id"] for m in json.loads(body)["data"]}
        if 7 in ids:
            return 500, b"cannot process 7", 0.0
        return 200, b"{}", (0.6 if 9 in ids else 0.0)

    receiver.behaviour = behaviour
    config = _config(source_db, write_config, receiver.url, max_retries=1,
                     destination={"batch_size": 1, "timeout_ms": 300}, **calls)
    drain, deliver = _start(config, spark)
    try:
        source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 12) g")
        for v in range(1, 8):  # other rows keep flowing, so the endpoint is seen to be up
            source_db.execute("UPDATE t SET v = %s WHERE id NOT IN (7, 9)", (v,))
            time.sleep(0.4)
        wait_until(lambda: [s for _, s, _, _ in _failed(config)] == ["discarded", "discarded"], 60,
                   f"both poison messages discarded: {_failed(config)}")
        wait_until(lambda: len(_log(config)) == 12 + 7 * 10, 30, "the drain")
        others = {k for k, r in _log(config) if r not in (7, 9)}
        wait_until(lambda: others <= set(receiver.acked_keys()), 30, "every other message")
        stats: DeliveryStats = deliver.finish()
    finally:
        deliver.stop()
        drain.finish()
    failed = _failed(config)
    assert [(r, s) for r, s, _, _ in failed] == [(7, "discarded"), (9, "discarded")], failed
    assert "HTTP 500" in failed[0][3] and "timeout" in failed[1][3]
    assert stats.discarded == 2
    assert {k for k, r in _log(config) if r == 7}.isdisjoint(receiver.acked_keys())


def test_deliver_until_idle_exits_non_zero_on_an_outage(
        source_db: Database, write_config: Callable[..., PipelineConfig], receiver: Receiver) -> None:
    """The one-off catch-up (`deliver --until-idle`, the CLI) does not wait for a destination that is down:
    it exits 1 naming the outage, parks nothing and keeps its offset; run again once it is back, it
    delivers everything."""
    config = _config(source_db, write_config, receiver.url, destination={"timeout_ms": 2000})
    source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 5) g")
    helpers.drain(config)
    cmd = [CLI, "--config", str(config.path), "deliver", "--sink", "hook", "--until-idle"]
    receiver.behaviour = lambda h, b: (503, b"maintenance", 0.0)
    down = subprocess.run(cmd, capture_output=True, text=True, timeout=150)  # waiting forever is the bug
    assert down.returncode == 1, down.stdout + down.stderr
    assert "503" in down.stderr and "error:" in down.stderr, down.stderr
    assert _answered(receiver, 503) >= 1 and receiver.acked_keys() == []
    assert _failed(config) == []
    with psycopg.connect(config.state_dsn) as conn:
        assert conn.execute("SELECT commit_lsn, commit_idx, delivered FROM cdc_pipeline.sink_offsets "
                            "WHERE sink = 'hook'").fetchone() in (None, (0, -1, 0))

    receiver.behaviour = lambda h, b: (200, b"{}", 0.0)
    up = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    assert receiver.acked_keys() == [k for k, _ in _log(config)]
