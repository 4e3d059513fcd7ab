"""Log retention (state.retention_hours) never deletes what an unreconciled backfill page or an undelivered
sink still needs (issue 9.5). The scenario of the issue, for real: a change lands between a page's
watermarks, is delivered, grows older than the retention, and only then does the drain reach the page's
high watermark. Had retention deleted the change, the page's stale read would overwrite it in the mirror."""

from __future__ import annotations

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.state import retention
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline_tests.helpers import assert_mirrored, backfill_page, deliver, drain, wait_until
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill_config

RETENTION_HOURS = 1 / 3600  # one second


def log_actions(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT pk, action FROM cdc_pipeline.change_log ORDER BY commit_lsn, commit_idx").fetchall()]


def wait_older_than_retention(dsn: str) -> None:
    """Until every logged change is older than the retention by the state database's clock (the one
    retention compares with): a condition, not a fixed sleep of the retention plus a margin."""
    def old_enough() -> bool:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT coalesce(max(commit_ts) < now() - make_interval(secs => %s), true) "
                               "FROM cdc_pipeline.change_log", (RETENTION_HOURS * 3600,)).fetchone()
        return bool(row and row[0])

    wait_until(old_enough, 60, "the logged changes to pass the retention")


def test_retention_keeps_what_an_open_page_and_an_idle_sink_need(source_db, db_factory, write_config, spark) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    data = backfill_config(source_db.dsn, dest.dsn, ["public.t"])
    data["state"] = {"retention_hours": RETENTION_HOURS}
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO public.t SELECT g, 'old' FROM generate_series(1, 10) g")
    drain(config)
    deliver(config, spark)

    # One page of a backfill: low watermark, the page read (row 5 is 'old' in its snapshot), then a change
    # of row 5 committed after the snapshot and before the high watermark.
    with backfill_page(config, "public.t", 100) as page:
        assert page.rows == 10
        source_db.execute("UPDATE public.t SET v = 'new' WHERE id = 5")
        drain(config)  # the change is logged; the page waits for its high watermark
        deliver(config, spark)  # ... and delivered: the sink has passed it
        wait_older_than_retention(config.state_dsn)  # the change is now older than the retention
        drain(config)  # a drain run ends with retention
        assert ("[5]", "update") in log_actions(config.state_dsn), "retention deleted what the page needs"
        page.close()
    drain(config)
    with psycopg.connect(config.state_dsn) as conn:
        dropped = conn.execute("SELECT status, rows_dropped FROM cdc_pipeline.backfills").fetchone()
    assert dropped == ("completed", 1)  # the read of row 5 was dropped: the change represents the row
    deliver(config, spark)
    assert assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t") == 10

    # Nothing waits now: what every sink has passed and is old enough goes.
    wait_older_than_retention(config.state_dsn)
    drain(config)
    assert log_actions(config.state_dsn) == []

    # A sink that has not delivered yet keeps its backlog, and a parked message stays.
    source_db.execute("UPDATE public.t SET v = 'newer' WHERE id <= 3")
    drain(config)
    wait_older_than_retention(config.state_dsn)
    with psycopg.connect(config.state_dsn) as conn:
        assert retention.trim_log(conn, "cdc_pipeline", RETENTION_HOURS, ["mirror", "not_started"]) == 0
        first = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log "
                             "ORDER BY 1, 2 LIMIT 1").fetchone()
        assert first is not None
        conn.execute("UPDATE cdc_pipeline.sink_offsets SET commit_lsn = 9e15 WHERE sink = 'mirror'")
        FailedMessages("cdc_pipeline").park(conn, "mirror", [((int(first[0]), int(first[1])), "[1]", "boom", 1)], [60000])
        assert retention.trim_log(conn, "cdc_pipeline", RETENTION_HOURS, ["mirror"]) == 2
        conn.rollback()
