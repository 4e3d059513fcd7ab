"""A bounded log that never loses silently: `state.max_backlog_hours`.

When a sink's oldest undelivered change is older than the limit:

* a row stream (`stream: rows`) is re-synchronised: its offset jumps to the log's head (so retention
  may delete the log behind it) and a backfill of each of its tables, for this sink only, runs beside
  the delivery. Rows are states, so the backfill's reads plus the changes after the head make the sink
  whole again. The backfill is resumed by the next delivery run if this one stops first.
* a change stream cannot be re-created from the table: delivery stops with BacklogExceeded, and the
  same message is shown by `status` and the sink's lag check. Its log is kept; nothing is skipped.

Without the key nothing changes: the log is kept until every sink has passed it.
"""

from __future__ import annotations

import logging
import threading

import psycopg

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.state.store import Position, Store

log = logging.getLogger(__name__)

ORIGIN = "backlog-resync"
CHECK_SECONDS = 60.0  # how often a running delivery checks again (it always checks when it starts)


class BacklogExceeded(RuntimeError):
    """A change-stream sink fell further behind than state.max_backlog_hours."""


def problem(config: PipelineConfig, sink: SinkConfig, age_seconds: float | None) -> str | None:
    """The loud error of a change-stream sink past the limit (None when within it, or a row stream)."""
    limit = config.state.max_backlog_hours
    if limit is None or age_seconds is None or age_seconds <= limit * 3600 or sink.stream == "rows":
        return None
    return (f"sink {sink.name!r} is stopped: its oldest undelivered change is {age_seconds / 3600:.2f} h old, more "
            f"than state.max_backlog_hours ({limit:g} h). A change stream cannot be rebuilt from the tables, so "
            "nothing was skipped and its log is kept: raise the limit (or remove it) to let it catch up, or "
            "switch it to `stream: rows` to re-synchronise it with a backfill")


def enforce(config: PipelineConfig, sink: SinkConfig, store: Store, conn: psycopg.Connection,
            offset: Position) -> tuple[Position, bool]:
    """(offset to deliver from, whether a resync was started now). Raises BacklogExceeded."""
    if config.state.max_backlog_hours is None:
        return offset, False
    age = store.oldest_age(conn, sink.tables, offset, sink=sink.name)
    error = problem(config, sink, age)
    if error:
        log.error(error)
        raise BacklogExceeded(error)
    if age is None or age <= config.state.max_backlog_hours * 3600:
        return offset, False
    head = store.log_head(conn, sink.tables, sink=sink.name)
    store.advance_offset(conn, sink.name, head, 0, 0, 0, None)
    conn.commit()
    log.warning("sink %s was %.2f h behind (more than state.max_backlog_hours): re-synchronising it from its "
                "tables with a backfill; its offset moves from %s:%s to the log head %s:%s",
                sink.name, age / 3600, *offset, *head)
    return head, True


def resync_tables(config: PipelineConfig, sink: SinkConfig, conn: psycopg.Connection, started: bool) -> list[str]:
    """The tables to backfill for the sink: all of them after a new resync, else those whose resync
    backfill is still active (a previous delivery run stopped before it finished)."""
    if started:
        return list(sink.tables)
    from cdc_pipeline.state.backfills import BackfillStore

    active = BackfillStore(config.state.schema_name).list(conn, active_only=True)
    conn.commit()
    return [f"{b.schema_name}.{b.table_name}" for b in active
            if b.origin == ORIGIN and list(b.sinks) == [sink.name]]


def start_resync(config: PipelineConfig, sink: SinkConfig, tables: list[str]) -> list[threading.Thread]:
    """One backfill thread per table; they wait for the drain to reconcile their pages."""
    from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest

    threads = []
    for table in tables:
        def run(table: str = table) -> None:
            try:
                result = Backfiller(config, BackfillRequest(table, sinks=(sink.name,), origin=ORIGIN),
                                    wait_if_busy=True).run()
                log.info("resync of sink %s: backfill of %s %s", sink.name, table, result.status)
            except Exception:
                log.exception("resync of sink %s: backfill of %s failed; the next delivery run resumes it",
                              sink.name, table)

        thread = threading.Thread(target=run, name=f"resync-{sink.name}-{table}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads
