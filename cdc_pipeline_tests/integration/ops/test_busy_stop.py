"""Clean stops of busy processes (test_clean_stop.py stops idle ones): `drain` signalled while writes flow,
`deliver` signalled mid-batch with a full window of calls outstanding. Each exits 0; nothing is lost or
duplicated (beyond a message sent again under its own idempotency key); and what the process held is
released, checked where it lives: its sessions on the database (by backend pid, seen before the signal),
its replication slot, its advisory locks, its HTTP connections to the endpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.lane_keeper import deliver_lock, send_lock
from cdc_pipeline.postgres.session import LOCK_KEY_SQL
from cdc_pipeline_tests import helpers
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config, wait_until
from cdc_pipeline_tests.integration.delivery.test_delivery_outage import _config, _log
from cdc_pipeline_tests.integration.sinks.test_webhook_window import Counting
from cdc_pipeline_tests.integration.sinks.test_webhook_window_cli import _offset, _position, answer_then_hold
from cdc_pipeline_tests.processes import CLI

WINDOW = 10


def _start(config: PipelineConfig, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([CLI, "--config", str(config.path), *args], stdout=out, stderr=out,
                                start_new_session=True)


def _backends(db: Database, *besides: int) -> set[int]:
    """Backend pids of every session on ``db`` (walsenders too) but this query's and ``besides``."""
    return {r[0] for r in db.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                     "AND pid <> pg_backend_pid() AND NOT (pid = ANY(%s))", (list(besides),))}


def _still(db: Database, pids: set[int]) -> set[int]:
    return {r[0] for r in db.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),))}


def _stop(proc: subprocess.Popen[bytes], log: Path, signum: int, then: Callable[[], None] = lambda: None) -> None:
    """Signal; once the process says it is stopping, ``then``; it must exit 0 within a bounded time."""
    proc.send_signal(signum)
    name = signal.Signals(signum).name
    wait_until(lambda: f"{name}: stopping cleanly" in log.read_text(errors="replace") or proc.poll() is not None,
               60, "the clean stop to begin")
    then()
    try:
        code = proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"still running 120 s after {name}:\n{log.read_text()[-3000:]}") from None
    assert code == 0, f"exit {code} after {name}:\n{log.read_text()[-3000:]}"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_drain_stopped_while_writes_flow_loses_and_repeats_nothing(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig],
        tmp_path: Path) -> None:
    source_db.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v text)")
    config = write_config(mirror_config(source_db.dsn, db_factory().dsn, ["public.t"]))
    setup(config)
    stop_writes = threading.Event()
    written = [0]
    writer = psycopg.connect(source_db.dsn, autocommit=True)

    def write() -> None:
        while not stop_writes.wait(0.01):  # transactions of 500 rows: the drain is mostly inside one
            n = written[0]
            writer.execute("INSERT INTO public.t SELECT g, 'v' FROM generate_series(%s::int, %s::int) g",
                           (n + 1, n + 500))
            written[0] = n + 500

    log = tmp_path / "drain.log"
    proc = _start(config, log, "drain")
    thread = threading.Thread(target=write, daemon=True)
    try:
        thread.start()
        wait_until(lambda: proc.poll() is not None or not thread.is_alive() or _logged(source_db) >= 2000, 120,
                   "the drain logging writes")
        assert thread.is_alive(), "the writer failed"
        assert proc.poll() is None, log.read_text()[-3000:]
        held = _backends(source_db, writer.info.backend_pid)
        assert held, "the drain's sessions"  # its walsender and its state session, at least
        before = written[0]
        _stop(proc, log, signal.SIGTERM)
        assert written[0] > before, "writes kept flowing through the stop"
    finally:
        stop_writes.set()
        thread.join(30)
        writer.close()
        _kill(proc)
    wait_until(lambda: not _still(source_db, held), 30, "the drain's sessions to end")
    assert source_db.execute("SELECT active FROM pg_replication_slots") == [(False,)]
    # What it did not log, a restart does: every write exactly once.
    helpers.drain(config)
    assert source_db.execute("SELECT count(*), count(DISTINCT record->>'id') FROM cdc_pipeline.change_log") == \
        [(written[0], written[0])]


def _logged(db: Database) -> int:
    return int(db.execute("SELECT count(*) FROM cdc_pipeline.change_log")[0][0])


def _advisory_held(db: Database, *names: str) -> int:
    return int(db.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND "
        f"((classid::bigint << 32) | objid::bigint) IN (SELECT {LOCK_KEY_SQL.replace('%s', 'n')} "
        "FROM unnest(%s::text[]) n)", (list(names),))[0][0])


def _connections_to(port: int) -> int:
    """Established TCP connections into this process's endpoint on ``port`` (the test hosts it)."""
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_deliver_stopped_mid_batch_with_a_full_window(
        source_db: Database, write_config: Callable[..., PipelineConfig], tmp_path: Path) -> None:
    """SIGTERM while `max_in_flight` calls of one message each are outstanding (answered once it said it
    is stopping): the stop sends nothing more, acknowledges nothing past what was answered, exits 0 and lets
    go of everything; a restart delivers the rest.
    Nothing lost; a message received twice is the same message under the same idempotency key."""
    receiver = Counting()
    try:
        config = _config(source_db, write_config, receiver.url, batch_size=1,
                         destination={"max_in_flight": WINDOW, "timeout_ms": 60000})
        source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g")
        helpers.drain(config)
        log_keys = _log(config)
        release = threading.Event()  # the held calls are acknowledged once the test lets go (after the signal)
        receiver.behaviour, answered = answer_then_hold(30, release)
        port = receiver.server.server_address[1]
        log = tmp_path / "deliver.log"
        proc = _start(config, log, "deliver", "--sink", "hook")
        try:
            wait_until(lambda: proc.poll() is not None or answered["n"] >= 30 + WINDOW, 120,
                       "a full window of calls outstanding")
            held = _backends(source_db)
            assert held and _advisory_held(source_db, deliver_lock("hook"), send_lock("hook")) == 2
            assert _connections_to(port) >= WINDOW  # one per outstanding call
            _stop(proc, log, signal.SIGTERM, then=release.set)
        finally:
            release.set()
            _kill(proc)
        assert answered["n"] == 30 + WINDOW, "sent more after the signal"
        wait_until(lambda: not _still(source_db, held), 30, "its sessions to end")
        assert _advisory_held(source_db, deliver_lock("hook"), send_lock("hook")) == 0
        wait_until(lambda: _connections_to(port) == 0, 30, "its connections to the endpoint to close")
        # It finished or abandoned the window (docs/explanation/operations.md): nothing acknowledged past
        # what the endpoint acknowledged.
        acked, offset = set(receiver.acked_keys()), _offset(config)
        assert len(acked) == 30 + WINDOW
        assert all(k in acked for k, _ in log_keys if _position(k) <= offset), offset

        receiver.behaviour = lambda h, b: (200, b"{}", 0.0)
        done = subprocess.run([CLI, "--config", str(config.path), "deliver", "--sink", "hook", "--until-idle"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        sent: dict[str, set[str]] = {}
        for _, body, status in receiver.requests:
            if 200 <= status < 300:
                for m in json.loads(body)["data"]:
                    sent.setdefault(m["metadata"]["idempotency_key"], set()).add(json.dumps(m, sort_keys=True))
        assert set(sent) == {k for k, _ in log_keys}  # nothing lost
        assert all(len(v) == 1 for v in sent.values())  # a repeat is the same message
    finally:
        receiver.stop()
