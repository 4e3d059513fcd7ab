"""A standby as the source (issue 33 item 4, PostgreSQL 16+): `source.dsn` names a physical standby, where the
slot lives and the drain decodes; `source.primary_dsn` its primary, for the publication, heartbeats, probes and
watermarks. One primary + standby per version for the module (the set-up is the slow part).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.check import check
from cdc_pipeline.admin.setup import SetupError, setup
from cdc_pipeline.backfill.engine import Backfiller
from cdc_pipeline.backfill.request import BackfillRequest
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests import standby as sb
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain

BIG = 2_000
TABLES = ["public.acct", "public.big"]


@pytest.fixture(scope="module", params=[16, 18], ids=lambda m: f"pg{m}")
def pair(request: pytest.FixtureRequest) -> Iterator[sb.Pair]:
    with sb.primary_and_standby(request.param) as pair:
        with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE src")
        with psycopg.connect(pair.primary.dsn("src"), autocommit=True) as conn:
            conn.execute("CREATE TABLE acct (id integer PRIMARY KEY, ver integer NOT NULL, note text)")
            conn.execute("CREATE TABLE big (id integer PRIMARY KEY, v text)")
            conn.execute("INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, %s) g", (BIG,))
        sb.wait_caught_up(pair.primary, pair.standby)
        yield pair


def _data(pair: sb.Pair, dest: Database | None = None, **source: Any) -> dict[str, Any]:
    return {
        "source": {"dsn": pair.standby.dsn("src"), "slot": "cdc_standby", "publication": "cdc_standby", **source},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100, "retry_initial_ms": 100, "retry_max_ms": 1000},
        "backfill": {"initial_page_size": 500, "max_page_size": 500},
        "tables": [{"name": t} for t in TABLES],
        "sinks": [{"name": "mirror", "tables": TABLES, "destination": {
            "type": "postgres", "dsn": dest.dsn if dest else "dbname=unused", "table": "mirror.{table}",
            "mode": "mirror"}}],
    }


def test_a_standby_without_primary_dsn_is_refused(pair: sb.Pair, write_config: Callable[..., PipelineConfig]) -> None:
    config = write_config(_data(pair))
    with pytest.raises(SetupError) as refused:
        setup(config)
    assert "reaches a standby" in str(refused.value) and "source.primary_dsn" in str(refused.value)
    with psycopg.connect(pair.primary.dsn("src")) as conn:  # nothing was made
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)


class Writers:
    """Transactions on the primary: new accounts, and updates of rows the backfill reads."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.count = dsn, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                self.count += 1
                k = self.count
                with conn.transaction():
                    conn.execute("INSERT INTO acct VALUES (%s, 1, 'new')", (k,))
                    conn.execute("UPDATE big SET v = v || '.w' WHERE id = %s", (k * 37 % BIG + 1,))
                self._stop.wait(0.002)

    def __enter__(self) -> Writers:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(30)


def test_drain_and_backfill_through_the_standby(pair: sb.Pair, db_factory: Callable[[], Database],
                                                write_config: Callable[..., PipelineConfig], spark: Any) -> None:
    dest = db_factory()
    primary_dsn = pair.primary.dsn("src")
    config = write_config(_data(pair, dest, primary_dsn=primary_dsn))
    findings = [str(f) for f in check(config, sinks=False)]
    assert any(f.startswith("OK      mode") and "standby" in f for f in findings), findings
    setup(config)
    with psycopg.connect(pair.standby.dsn("src")) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_standby'"
                            ).fetchone() == (1,)
    drainer = Drain(config)
    thread = threading.Thread(target=drainer.run, daemon=True)
    thread.start()
    try:
        with Writers(primary_dsn) as writers, psycopg.connect(pair.standby.dsn(), autocommit=True) as standby:
            # Replay stopped while rows the backfill reads change on the primary: the first page (its low
            # watermark after those changes) must wait for the standby. Read at once, its snapshot would miss
            # the changes, and the reconciliation would drop those 400 rows as stale (exact still when the log
            # holds the changes; lost when it does not: a gap's backfill).
            standby.execute("SELECT pg_wal_replay_pause()")
            with psycopg.connect(primary_dsn, autocommit=True) as conn:
                conn.execute("UPDATE big SET v = 'changed while replay paused' WHERE id <= 400")
            resume = threading.Timer(0.5, lambda: standby.execute("SELECT pg_wal_replay_resume()"))
            resume.start()
            progress = Backfiller(config, BackfillRequest("public.big")).run()
            resume.join()
            assert progress.status == "completed", progress
            assert progress.rows_dropped < 100, progress  # only rows the writers touched during a page
            assert writers.count > 0
    finally:
        drainer.stop()
        thread.join(60)
    stats = drain(config)  # the rest, until idle (its probe goes through the primary and back)
    assert stats.heartbeats > 0
    deliver(config, spark)
    for table in ("acct", "big"):
        assert_mirrored(primary_dsn, f"public.{table}", dest.dsn, f"mirror.{table}")
