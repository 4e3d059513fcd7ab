"""How far the drain has logged a slot (`slot_progress`), and the change log's bulk writes.

The drain commits its log rows and this position in one state transaction (capture/logwriter.py), so the
log and its recorded position never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg
from psycopg import sql


def copy_into_log(schema: str, columns: Sequence[str]) -> sql.Composed:
    """COPY ... FROM STDIN into the change log, for rows of `columns` in that order."""
    return sql.SQL("COPY {}.change_log ({}) FROM STDIN").format(
        sql.Identifier(schema), sql.SQL(", ").join(map(sql.Identifier, columns)))


def save(state: psycopg.Connection, schema: str, slot: str, end_lsn: int, ts: object) -> None:
    """Record that the log holds everything of `slot` up to `end_lsn` (a heartbeat when `ts` is None)."""
    state.execute(sql.SQL(
        "INSERT INTO {}.slot_progress AS p (slot, committed_lsn, last_commit_ts, last_heartbeat_at, "
        "updated_at) VALUES (%s, %s, %s, now(), now()) ON CONFLICT (slot) DO UPDATE SET "
        "committed_lsn = excluded.committed_lsn, last_commit_ts = coalesce(excluded.last_commit_ts, "
        "p.last_commit_ts), last_heartbeat_at = now(), updated_at = now()").format(sql.Identifier(schema)),
        (slot, end_lsn, ts))


def load(state: psycopg.Connection, schema: str, slot: str) -> int | None:
    """The recorded progress, or None when this slot never committed anything to this log."""
    row = state.execute(sql.SQL("SELECT committed_lsn FROM {}.slot_progress WHERE slot = %s").format(
        sql.Identifier(schema)), (slot,)).fetchone()
    return int(row[0]) if row else None


def heartbeat(state: psycopg.Connection, schema: str, slot: str) -> tuple[int, float | None]:
    """(committed LSN, seconds since the drain last committed to the log) for a slot; (0, None) if never."""
    row = state.execute(sql.SQL(
        "SELECT committed_lsn, extract(epoch FROM now() - last_heartbeat_at)::float8 "
        "FROM {}.slot_progress WHERE slot = %s").format(sql.Identifier(schema)), (slot,)).fetchone()
    return (int(row[0]), row[1]) if row else (0, None)


def skip_gap(state: psycopg.Connection, schema: str, table_schema: str, table_name: str,
             at: tuple[int, int], ts: datetime, backfill_id: str) -> None:
    """A `truncate` of a table at a gap's position, before the backfill that repairs it (capture/gap.py)."""
    state.execute(sql.SQL(
        "INSERT INTO {}.change_log (commit_lsn, commit_idx, table_schema, table_name, action, "
        "commit_ts, backfill_id) VALUES (%s, %s, %s, %s, 'truncate', %s, %s)").format(sql.Identifier(schema)),
        (at[0], at[1], table_schema, table_name, ts, backfill_id))


def accept(state: psycopg.Connection, schema: str, slot: str, lsn: int) -> None:
    """Take the slot's position as the log's (after a gap was recorded)."""
    state.execute(sql.SQL("UPDATE {}.slot_progress SET committed_lsn = %s, updated_at = now() WHERE slot = %s")
                  .format(sql.Identifier(schema)), (lsn, slot))
