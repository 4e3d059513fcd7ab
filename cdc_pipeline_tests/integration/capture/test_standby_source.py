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
from cdc_pipeline.admin.status import collect
from cdc_pipeline.backfill.engine import Backfiller
from cdc_pipeline.backfill.request import BackfillRequest
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.capture.faults import DrainFatal
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests import standby as sb
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.evolving import Writers
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, wait_until

BIG = 2_000
TABLES = ["public.acct", "public.big"]


@pytest.fixture(scope="module", params=[16, 18], ids=lambda m: f"pg{m}")
def pair(request: pytest.FixtureRequest) -> Iterator[sb.Pair]:
    with sb.primary_and_standby(request.param) as pair:
        sb.create_source(pair.primary, BIG)
        sb.wait_caught_up(pair.primary, pair.standby)
        # The tables as a new session on the standby sees them, not only the replay position (once, on 18, a
        # test right after found them missing there; the cause is not known).
        wait_until(lambda: _standby_tables(pair) == 2, what="the source tables on the standby")
        yield pair


def _standby_tables(pair: sb.Pair) -> int:
    with psycopg.connect(pair.standby.dsn("src")) as conn:
        row = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN "
                           "('acct', 'big')").fetchone()
    return int(row[0]) if row else 0


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


def _write(conn: psycopg.Connection, n: int) -> int:
    """A transaction on the primary: a new account, and an update of a row the backfill reads."""
    with conn.transaction():
        conn.execute("INSERT INTO acct VALUES (%s, 1, 'new')", (n,))
        conn.execute("UPDATE big SET v = v || '.w' WHERE id = %s", (n * 37 % BIG + 1,))
    return 2


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
        with Writers(primary_dsn, _write, count=1) as writers, psycopg.connect(pair.standby.dsn(), autocommit=True) as standby:
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
            assert writers.changes > 0
    finally:
        drainer.stop()
        thread.join(60)
    stats = drain(config)  # the rest, until idle (its probe goes through the primary and back)
    assert stats.heartbeats > 0
    deliver(config, spark)
    for table in ("acct", "big"):
        assert_mirrored(primary_dsn, f"public.{table}", dest.dsn, f"mirror.{table}")


# Last in the module: it promotes the pair's standby. Up to 16 a logical slot lives only on the primary.
@pytest.mark.parametrize("pair", [16], ids=["pg16"], indirect=True)
def test_promotion_loses_the_slot_up_to_16_a_gap(pair: sb.Pair, db_factory: Callable[[], Database],
                                                 write_config: Callable[..., PipelineConfig], spark: Any) -> None:
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE fo")
    with psycopg.connect(pair.primary.dsn("fo"), autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id integer PRIMARY KEY, ver integer NOT NULL, note text)")
        conn.execute("INSERT INTO acct SELECT g, 1, 'before' FROM generate_series(1, 100) g")
    dest = db_factory()
    data = {
        "source": {"dsn": pair.multi_host_dsn("fo"), "slot": "cdc_fo", "publication": "cdc_fo"},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100, "retry_initial_ms": 100, "retry_max_ms": 500,
                  "on_gap": "stop"},
        "tables": [{"name": "public.acct"}],
        "sinks": [{"name": "mirror", "tables": ["public.acct"], "destination": {
            "type": "postgres", "dsn": dest.dsn, "table": "mirror.{table}", "mode": "mirror"}}],
    }
    config = write_config(data)
    setup(config)
    drain(config)
    with psycopg.connect(config.source.dsn, autocommit=True) as conn:  # in the slot only: lost with it
        conn.execute("UPDATE acct SET ver = 2, note = 'unread at the promotion' WHERE id <= 30")
        conn.execute("INSERT INTO acct SELECT g, 1, 'unread' FROM generate_series(101, 120) g")
    sb.wait_caught_up(pair.primary, pair.standby)
    pair.primary.stop("fast")
    sb.promote(pair.standby)
    with psycopg.connect(config.source.dsn, autocommit=True) as conn:
        assert conn.info.port == pair.standby.port
        conn.execute("UPDATE acct SET ver = 3, note = 'after' WHERE id > 90")
    # on_gap: stop: the drain refuses, saying what happened and the recovery.
    with pytest.raises(DrainFatal) as stopped:
        drain(config)
    assert "missing after a failover" in str(stopped.value) and "drain.on_gap: backfill" in str(stopped.value)
    # on_gap: backfill: the slot made again on the new primary, the gap backfilled, nothing lost.
    data["drain"]["on_gap"] = "backfill"
    config = write_config(data, name="backfill.yaml")
    stats = drain(config)
    assert len(stats.gaps) == 1, stats
    deliver(config, spark)
    assert_mirrored(config.source.dsn, "public.acct", dest.dsn, "mirror.acct")
    status = collect(config)
    assert status["source"]["failovers"] == 1 and f":{pair.standby.port}" in status["source"]["server"], status
    assert any("drain gap" in line for line in status["backfills_text"]), status["backfills_text"]


# Last in the module too (on the other pair): an unclean stop. A slot that is not a failover slot is lost as on
# 16; here the drain had read changes the standby never received, and the state lives apart from the source.
@pytest.mark.parametrize("pair", [18], ids=["pg18"], indirect=True)
def test_a_log_past_the_new_timeline_is_refused(pair: sb.Pair, db_factory: Callable[[], Database],
                                                write_config: Callable[..., PipelineConfig]) -> None:
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE uc")
    with psycopg.connect(pair.primary.dsn("uc"), autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id integer PRIMARY KEY, ver integer NOT NULL, note text)")
    state = db_factory()
    config = write_config({
        "source": {"dsn": pair.multi_host_dsn("uc"), "slot": "cdc_uc", "publication": "cdc_uc"},
        "state": {"dsn": state.dsn},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100, "retry_initial_ms": 100, "on_gap": "backfill"},
        "tables": [{"name": "public.acct"}],
        "sinks": [{"name": "mirror", "tables": ["public.acct"], "destination": {
            "type": "postgres", "dsn": state.dsn, "table": "mirror.{table}", "mode": "mirror"}}],
    })
    setup(config)
    sb.wait_caught_up(pair.primary, pair.standby)
    with psycopg.connect(pair.standby.dsn(), autocommit=True) as conn:  # the standby stops receiving
        conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
        conn.execute("SELECT pg_reload_conf()")
        wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone() == (0,),
                   what="the standby's WAL receiver to stop")
    with psycopg.connect(pair.primary.dsn("uc"), autocommit=True) as conn:
        conn.execute("INSERT INTO acct SELECT g, 1, repeat('x', 100) FROM generate_series(1, 500) g")
    assert drain(config).changes == 500  # logged: the new primary will never have them
    pair.primary.stop("immediate")
    sb.promote(pair.standby)
    with pytest.raises(DrainFatal) as refused:
        drain(config)
    assert "past the point where the new primary's timeline branched off" in str(refused.value)
    with psycopg.connect(config.source.dsn) as conn:  # refused before making a slot: a restart says so again
        assert conn.info.port == pair.standby.port
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_uc'").fetchone() == (0,)
