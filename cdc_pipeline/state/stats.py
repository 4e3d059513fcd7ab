"""Read-only views of the state schema for `cdc-pipeline status`: drain progress, log size, sink offsets."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from cdc_pipeline.postgres import catalog


def drain_progress(conn: psycopg.Connection, schema: str, slot: str) -> dict[str, Any] | None:
    """What the drain last committed for a slot, and how long ago its last heartbeat was."""
    row = conn.execute(sql.SQL(
        "SELECT committed_lsn, last_commit_ts, last_heartbeat_at, "
        "extract(epoch FROM now() - last_heartbeat_at)::float8 FROM {}.slot_progress WHERE slot = %s"
    ).format(sql.Identifier(schema)), (slot,)).fetchone()
    if row is None:
        return None
    return {"committed_lsn": row[0], "last_commit_ts": row[1], "last_heartbeat_at": row[2],
            "heartbeat_age_seconds": row[3]}


def log_stats(conn: psycopg.Connection, schema: str) -> dict[str, Any]:
    row = conn.execute(sql.SQL("SELECT count(*), max(commit_lsn) FROM {}.change_log").format(
        sql.Identifier(schema))).fetchone()
    assert row is not None
    return {"messages": int(row[0]), "bytes": catalog.total_size(conn, schema, "change_log"), "head_lsn": row[1]}


def sink_offset_row(conn: psycopg.Connection, schema: str, sink: str) -> dict[str, Any] | None:
    row = conn.execute(sql.SQL(
        "SELECT commit_lsn, commit_idx, delivered, filtered, updated_at, waiting_since, waiting_reason "
        "FROM {}.sink_offsets WHERE sink = %s"
    ).format(sql.Identifier(schema)), (sink,)).fetchone()
    if row is None:
        return None
    return {"position": (int(row[0]), int(row[1])), "delivered": int(row[2]), "filtered": int(row[3]),
            "updated_at": row[4], "waiting_since": row[5], "waiting_reason": row[6]}


def has_backfills(conn: psycopg.Connection, schema: str) -> bool:
    """False for a state schema from before backfills (`cdc-pipeline setup` migrates it)."""
    return catalog.table_exists(conn, schema, "backfills")
