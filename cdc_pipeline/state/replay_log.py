"""Reads of the change log for replays: a commit-time window, and how far back the log still reaches."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg
import pyarrow as pa
from psycopg import sql

from cdc_pipeline.state.base import Position
from cdc_pipeline.state.change_log import ChangeLog


def trimmed_until(conn: psycopg.Connection, log: ChangeLog) -> datetime | None:
    """The newest commit time retention has deleted from the log; None if it never deleted anything."""
    row = conn.execute(sql.SQL("SELECT trimmed_until FROM {}.log_trimmed").format(log.s)).fetchone()
    return row[0] if row else None


def oldest_retained(conn: psycopg.Connection, log: ChangeLog) -> datetime | None:
    row = conn.execute(sql.SQL("SELECT min(commit_ts) FROM {}.change_log").format(log.s)).fetchone()
    return row[0] if row else None


def load_window(conn: psycopg.Connection, log: ChangeLog, tables: Sequence[str], sink: str, start: datetime,
                end: datetime | None, after: Position, upto: Position, limit: int) -> pa.Table:
    """The sink's log rows committed in [start, end), after `after` and up to `upto`, in commit order.
    Commit order is position order and commit times grow with it, so the window is a position range."""
    where = sql.SQL(
        "WHERE commit_ts >= %s AND (%s::timestamptz IS NULL OR commit_ts < %s) "
        "AND (commit_lsn, commit_idx) > (%s, %s) AND (commit_lsn, commit_idx) <= (%s, %s) "
        "AND table_schema || '.' || table_name = ANY(%s) {routing}"
        "ORDER BY commit_lsn, commit_idx LIMIT %s").format(routing=log.routing(sink))
    return log.select(conn, where, (start, end, end, after[0], after[1], upto[0], upto[1], list(tables), sink,
                                    limit))
