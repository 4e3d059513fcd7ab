"""state.max_backlog_hours: a row stream too far behind is re-synced by a backfill (and the log behind it
may go); a change stream too far behind stops loudly (run, status, lag check) and skips nothing."""

from __future__ import annotations

import time

import psycopg
import pytest
from dagster import AssetKey
from psycopg import conninfo

from cdc_pipeline.admin import status
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.defs.health import SINK_LAG_CHECK, sink_checks, sink_figures
from cdc_pipeline.delivery.backlog import BacklogExceeded
from cdc_pipeline.state import retention
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.sink_offsets import SinkOffsets
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config, rows, wait_until
from cdc_pipeline_tests.integration.backfill.test_backfill import drain_running

LIMIT_HOURS = 1.0 / 3600  # one second


def wait_past_limit(config, hours: float = LIMIT_HOURS) -> None:  # type: ignore[no-untyped-def]
    """Until the sink's oldest undelivered change is older than the limit, by the state database's clock
    (the one the limit is checked with)."""
    def old_enough() -> bool:
        with psycopg.connect(config.state_dsn) as conn:
            offset = SinkOffsets("cdc_pipeline").sink_offset(conn, "mirror")
            age = ChangeLog("cdc_pipeline").oldest_age(conn, config.sink("mirror").tables, offset, sink="mirror")
        return age is not None and age > hours * 3600

    wait_until(old_enough, 60, "the backlog to pass the limit")


def test_change_stream_past_the_limit_stops_loudly_and_skips_nothing(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["state"] = {"max_backlog_hours": LIMIT_HOURS}
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 30) g")
    drain(config)
    wait_past_limit(config)
    with pytest.raises(BacklogExceeded, match="sink 'mirror' is stopped.*max_backlog_hours"):
        deliver(config, spark)
    with psycopg.connect(config.state_dsn) as conn:
        assert SinkOffsets("cdc_pipeline").sink_offset(conn, "mirror") == (0, -1)  # not moved, nothing skipped
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.change_log").fetchone() == (30,)
    shown = status.collect(config)["sinks"]["mirror"]
    assert "is stopped" in shown["error"] and "ERROR: sink 'mirror' is stopped" in status.render(status.collect(config))
    [lag_check] = [c for c in sink_checks(config, AssetKey(["sink", "mirror"]), sink_figures(config, config.sink("mirror")), "mirror")
                   if c.check_name == SINK_LAG_CHECK]
    assert not lag_check.passed and "is stopped" in (lag_check.description or "")

    # Without the limit it catches up with every change.
    del data["state"]
    config = write_config(data)
    deliver(config, spark)
    assert assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t") == 30


def test_row_stream_past_the_limit_is_resynced_by_a_backfill(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"], stream="rows")
    data["state"] = {"max_backlog_hours": LIMIT_HOURS}
    data["drain"] = {"heartbeat_seconds": 0.5, "batch_ms": 100}
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t SELECT g, 'v0' FROM generate_series(1, 40) g")
    drain(config)
    deliver(config, spark)
    source_db.execute("UPDATE t SET v = 'v1' WHERE id <= 20")
    source_db.execute("INSERT INTO t SELECT g, 'new' FROM generate_series(41, 60) g")
    drain(config)
    with psycopg.connect(config.state_dsn) as conn:
        behind = ChangeLog("cdc_pipeline").log_head(conn, ["public.t"])
    wait_past_limit(config)
    with drain_running(config):
        stats = deliver(config, spark)  # until idle: waits for its resync backfill to be delivered
    assert assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t") == 60
    with psycopg.connect(config.state_dsn) as conn:
        origin = conn.execute("SELECT origin, sinks, status FROM cdc_pipeline.backfills").fetchall()
        offset = SinkOffsets("cdc_pipeline").sink_offset(conn, "mirror")
    assert origin == [("backlog-resync", ["mirror"], "completed")]
    assert offset > behind and stats.delivered == 60  # the backfill's 60 rows, not the 40 skipped changes
    # The log behind it may now be deleted: retention no longer waits for this sink.
    with psycopg.connect(config.state_dsn) as conn:
        assert retention.trim_log(conn, "cdc_pipeline", 0.0001, ["mirror"]) >= 80
        conn.commit()
    assert {r["v"] for r in rows(dest.dsn, "mirror.t") if r["id"] <= 20} == {"v1"}


def test_a_running_delivery_that_falls_behind_stops_loudly(source_db, db_factory, write_config, spark, monkeypatch):
    """The limit is checked again while a long delivery runs, not only when it starts: here a slow
    destination lets a change stream fall further behind than the limit mid-run."""
    from cdc_pipeline.delivery import backlog
    from cdc_pipeline.delivery.engine import Deliverer
    from cdc_pipeline.sinks import build_sink

    monkeypatch.setattr(backlog, "CHECK_SECONDS", 0.3)
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["state"] = {"max_backlog_hours": 4 * LIMIT_HOURS}
    data["sinks"][0]["batch_size"] = 5
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 60) g")
    drain(config)
    sink = build_sink(config.sink("mirror"))
    deliver_batch = sink.deliver

    def slow(batch):  # type: ignore[no-untyped-def]  # a destination taking 0.5 s per 5 messages
        time.sleep(0.5)
        return deliver_batch(batch)

    sink.deliver = slow  # type: ignore[method-assign]
    with pytest.raises(BacklogExceeded, match="sink 'mirror' is stopped"):  # within the start's limit
        Deliverer(config, config.sink("mirror"), spark, sink=sink).run(until_idle=False, seconds=120)
    with psycopg.connect(config.state_dsn) as conn:
        offset = SinkOffsets("cdc_pipeline").sink_offset(conn, "mirror")
    assert offset > (0, -1)  # it delivered some, then stopped; the rest is kept in the log
    assert len(rows(dest.dsn, "mirror.t")) < 60


def test_a_resync_that_cannot_start_skips_nothing(source_db, db_factory, write_config, spark, caplog):
    """The source is unreachable when a row stream's resync should start: the resync is tried (and says
    so), no backfill is registered, so its offset does not move past the log either (the backlog is
    delivered from it): nothing skipped."""
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"], stream="rows")
    data["state"] = {"dsn": source_db.dsn, "max_backlog_hours": LIMIT_HOURS}
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t SELECT g, 1 FROM generate_series(1, 10) g")
    drain(config)
    deliver(config, spark)
    source_db.execute("UPDATE t SET v = 2")
    drain(config)
    with psycopg.connect(config.state_dsn) as conn:
        head = ChangeLog("cdc_pipeline").log_head(conn, ["public.t"])
    wait_past_limit(config)
    # A port nothing listens on: the source is down (the state database is up).
    down = {**data, "source": {**data["source"], "dsn": conninfo.make_conninfo(source_db.dsn, port="1")}}
    with caplog.at_level("WARNING", logger="cdc_pipeline.delivery.backlog"):
        deliver(write_config(down, "down.yaml"), spark)
    tried = [r.getMessage() for r in caplog.records if "resync cannot start" in r.getMessage()]
    assert tried and tried[0].startswith("sink mirror is "), caplog.text[-3000:]
    with psycopg.connect(config.state_dsn) as conn:
        assert SinkOffsets("cdc_pipeline").sink_offset(conn, "mirror") == head  # delivered, not skipped
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.backfills").fetchone() == (0,)
    assert {r["v"] for r in rows(dest.dsn, "mirror.t")} == {2}
