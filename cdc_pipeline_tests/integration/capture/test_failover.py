"""Failover on a real primary and physical standby (issue 33 item 3): a promotion under a write load with a
drain and a backfill running (CLI processes, as users run them) on a multi-host `source.dsn`.

17+: `source.failover: true` makes a failover slot; after the old primary stops and the standby is promoted,
the drain goes on from the synced slot: nothing lost (judged against the new primary's own rows), each change
logged once, the mirror equal, and `status` names the server read and the failover.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.check import check
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.admin.status import collect
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests import standby as sb
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, wait_until
from cdc_pipeline_tests.processes import spawn, stop

SLOT = "cdc_failover"
BIG = 6_000  # rows the backfill reads, in pages of 100: it spans the promotion


class Writers:
    """Client transactions against whichever server is the primary, riding through the promotion; the
    keys of the transactions the server acknowledged."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.acked, self.errors = dsn, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        key = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                    while not self._stop.is_set():
                        key += 1
                        with conn.transaction():
                            conn.execute("INSERT INTO acct VALUES (%s, 1, 'new')", (key,))
                            conn.execute("UPDATE acct SET ver = ver + 1, note = 'touched' WHERE id = %s",
                                         (max(1, key - 7),))
                        self.acked.append(key)
            except psycopg.Error:
                self.errors += 1  # the primary went away: connect again (to the promoted one)
                self._stop.wait(0.05)

    def __enter__(self) -> Writers:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(60)


@contextmanager
def _running(config: PipelineConfig, *args: str) -> Iterator[Any]:
    proc = spawn(str(config.path), *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        print(args, proc.communicate()[1][-6000:])


def _prepare(pair: sb.Pair, dest: Database, write_config: Callable[..., PipelineConfig],
             **source: Any) -> PipelineConfig:
    sb.create_source(pair.primary, BIG)
    tables = ["public.acct", "public.big"]
    config = write_config({
        "source": {"dsn": pair.multi_host_dsn("src"), "slot": SLOT, "publication": "cdc_test", **source},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100, "retry_initial_ms": 100, "retry_max_ms": 1000,
                  "on_gap": "backfill"},
        "backfill": {"initial_page_size": 100, "max_page_size": 100, "max_staged_pages": 2},
        "tables": [{"name": t} for t in tables],
        "sinks": [{"name": "mirror", "tables": tables, "destination": {
            "type": "postgres", "dsn": dest.dsn, "table": "mirror.{table}", "mode": "mirror"}}],
    })
    setup(config)
    return config


def _log(config: PipelineConfig, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(config.state_dsn) as conn:
        return conn.execute(query).fetchall()


def _promote_under_load(pair: sb.Pair, config: PipelineConfig, writers: Writers) -> None:
    """Writes and backfill pages on the old primary, then its stop and the standby's promotion."""
    wait_until(lambda: len(writers.acked) > 200, what="writes on the old primary")
    wait_until(lambda: _log(config, "SELECT count(*) FROM cdc_pipeline.change_log WHERE action = 'read'")[0][0]
               >= 300, what="backfill pages logged before the promotion")
    pair.primary.stop("fast")
    sb.promote(pair.standby)
    acked = len(writers.acked)
    wait_until(lambda: len(writers.acked) > acked + 200, what="writes on the promoted standby")


def _finish(config: PipelineConfig, dest: Database, spark: Any, drainer: Any, backfiller: Any) -> None:
    out, err = backfiller.communicate(timeout=300)
    assert backfiller.returncode == 0 and "completed" in out, err[-3000:]
    assert stop(drainer, signal.SIGTERM, 60)[0] == 0
    drain(config)  # the rest, until idle
    deliver(config, spark)
    for table in ("acct", "big"):
        assert_mirrored(config.source.dsn, f"public.{table}", dest.dsn, f"mirror.{table}")


@pytest.mark.parametrize("major", [17, 18], ids=lambda m: f"pg{m}")
def test_promotion_under_load_with_a_failover_slot(major: int, db_factory: Callable[[], Database],
                                                  write_config: Callable[..., PipelineConfig], spark: Any) -> None:
    with sb.primary_and_standby(major, sync_slots=True) as pair:
        dest = db_factory()
        config = _prepare(pair, dest, write_config, failover=True)
        findings = [str(f) for f in check(config, sinks=False)]
        assert any(f.startswith("OK      failover") and "sync_replication_slots" in f for f in findings), findings
        with _running(config, "drain") as drainer, _running(config, "backfill", "public.big", "--quiet") as backfiller:
            with Writers(config.source.dsn) as writers:
                sb.wait_slot_synced(pair.primary, pair.standby, SLOT, dbname="src")  # the drain moves the slot
                _promote_under_load(pair, config, writers)
            _finish(config, dest, spark, drainer, backfiller)
        with psycopg.connect(config.source.dsn) as conn:  # the new primary's own history
            assert conn.info.port == pair.standby.port
            on_new = {r[0] for r in conn.execute("SELECT id FROM acct")}
        assert set(writers.acked) <= on_new, "a commit acknowledged by the old primary is not on the new one"
        # Each change once: per row, its versions in the log are distinct (a replay would repeat one).
        dup = _log(config, "SELECT pk, record->>'ver', count(*) FROM cdc_pipeline.change_log WHERE table_name = "
                   "'acct' AND action <> 'read' GROUP BY 1, 2 HAVING count(*) > 1")
        assert dup == [], dup[:10]
        status = collect(config)["source"]
        assert status["failovers"] == 1 and f"127.0.0.1:{pair.standby.port}" in status["server"], status
        assert f":{pair.primary.port}" in status["last_failover"].split(" -> ")[0], status

