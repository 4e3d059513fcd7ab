"""A bounded log that never loses silently: `state.max_backlog_hours`.

When a sink's oldest undelivered change is older than the limit:

* a row stream (`stream: rows`) is re-synchronised: its offset jumps to the log's head (so retention
  may delete the log behind it) and a backfill of each of its tables, for this sink only, runs beside
  the delivery. The backfills are registered in the same state transaction as the offset move, so a
  resync that cannot start (source down, a conflicting backfill, a kill) moves nothing: the backlog is
  delivered from the log meanwhile and the resync is tried again at the next check. Rows are states, so the backfill's reads plus the changes after the head make the sink
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
from cdc_pipeline.core.positions import Position
from cdc_pipeline.postgres import session
from cdc_pipeline.state.backfills import BackfillError, BackfillStore
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.sink_offsets import SinkOffsets

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


def enforce(config: PipelineConfig, sink: SinkConfig, change_log: ChangeLog, offsets: SinkOffsets,
            conn: psycopg.Connection, offset: Position) -> tuple[Position, bool]:
    """(offset to deliver from, whether a resync was started now). Raises BacklogExceeded."""
    if config.state.max_backlog_hours is None:
        return offset, False
    age = change_log.oldest_age(conn, sink.tables, offset, sink=sink.name)
    error = problem(config, sink, age)
    if error:
        log.error(error)
        raise BacklogExceeded(error)
    if age is None or age <= config.state.max_backlog_hours * 3600:
        return offset, False
    head = change_log.log_head(conn, sink.tables, sink=sink.name)
    try:  # the offset moves past the log only with the resync backfills that replace it: one transaction
        registered = _move_and_register(config, sink, offsets, conn, head)
    except (psycopg.OperationalError, BackfillError) as exc:
        conn.rollback()
        log.warning("sink %s is %.2f h behind (more than state.max_backlog_hours) but its resync cannot start "
                    "(%s): delivering its backlog from the log meanwhile; tried again in %.0f s",
                    sink.name, age / 3600, " ".join(str(exc).split())[:300], CHECK_SECONDS)
        return offset, False
    bf = BackfillStore(config.state.schema_name)
    for backfill_id in registered:  # the runner threads take them over (start_resync)
        bf.release(conn, backfill_id)
    conn.commit()
    log.warning("sink %s was %.2f h behind (more than state.max_backlog_hours): re-synchronising it from its "
                "tables with a backfill; its offset moves from %s:%s to the log head %s:%s",
                sink.name, age / 3600, *offset, *head)
    return head, True


def _move_and_register(config: PipelineConfig, sink: SinkConfig, offsets: SinkOffsets, conn: psycopg.Connection,
                       head: Position) -> list[str]:
    """Move the sink's offset to ``head`` and register (claim) the resync backfill of each of its tables, in
    one committed transaction of ``conn``; the backfills' ids (their runner locks still held by ``conn``).
    The tables' keys are read from the source first: a source that cannot be reached, or a conflicting
    active backfill, raises with nothing moved or registered."""
    from cdc_pipeline.backfill.engine import BackfillRequest, resolve, table_shape

    specs = [resolve(config, BackfillRequest(table, sinks=(sink.name,), origin=ORIGIN)) for table in sink.tables]
    with session.connect(config.source.dsn, autocommit=True, application_name="cdc_pipeline.backfill") as src:
        shapes = [table_shape(src, spec, config.source.publication) for spec in specs]
    backfills = BackfillStore(config.state.schema_name)
    claimed: list[str] = []
    try:
        offsets.advance_offset(conn, sink.name, head, 0, 0, 0, None)  # opens the transaction the claims join
        for spec, shape in zip(specs, shapes, strict=True):
            backfill_id, _ = backfills.claim(conn, spec, shape.primary_key, shape.keyset, ORIGIN, None,
                                             max_parallel=config.backfill.max_parallel)
            claimed.append(backfill_id)
        conn.commit()
    except BaseException:
        conn.rollback()
        for backfill_id in claimed:  # their rows rolled back with the transaction; their runner locks did not
            backfills.release(conn, backfill_id)
        conn.commit()
        raise
    return claimed


def resync_tables(config: PipelineConfig, sink: SinkConfig, conn: psycopg.Connection, started: bool) -> list[str]:
    """The tables to backfill for the sink: all of them after a new resync, else those whose resync
    backfill is still active (a previous delivery run stopped before it finished)."""
    if started:
        return list(sink.tables)
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
