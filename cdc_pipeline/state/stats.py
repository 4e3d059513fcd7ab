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
    """The sink's progress; with lanes (core/lanes.py), its slowest lane's position, the lanes' counts
    summed, its first waiting lane's wait, and each lane's own figures under ``lanes``."""
    rows = sink_lane_rows(conn, schema, sink)
    if not rows:
        return None
    waiting = [r for r in rows if r["waiting_since"] is not None]
    return {"position": min(r["position"] for r in rows), "delivered": sum(r["delivered"] for r in rows),
            "filtered": sum(r["filtered"] for r in rows), "updated_at": max(r["updated_at"] for r in rows),
            "rows_read": sum(r["rows_read"] for r in rows),
            "waiting_since": waiting[0]["waiting_since"] if waiting else None,
            "waiting_reason": waiting[0]["waiting_reason"] if waiting else None,
            **({"lanes": rows} if len(rows) > 1 else {})}


def sink_lane_rows(conn: psycopg.Connection, schema: str, sink: str) -> list[dict[str, Any]]:
    rows = conn.execute(sql.SQL(
        "SELECT lane, commit_lsn, commit_idx, delivered, filtered, updated_at, waiting_since, waiting_reason, "
        "rows_read FROM {}.sink_offsets WHERE sink = %s ORDER BY lane"
    ).format(sql.Identifier(schema)), (sink,)).fetchall()
    return [{"lane": int(r[0]), "position": (int(r[1]), int(r[2])), "delivered": int(r[3]), "filtered": int(r[4]),
             "updated_at": r[5], "waiting_since": r[6], "waiting_reason": r[7], "rows_read": int(r[8])} for r in rows]


def has_backfills(conn: psycopg.Connection, schema: str) -> bool:
    """False for a state schema from before backfills (`cdc-pipeline setup` migrates it)."""
    return catalog.table_exists(conn, schema, "backfills")
