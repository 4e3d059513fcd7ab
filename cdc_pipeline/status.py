"""`cdc-pipeline status`: slot lag, log size, sink offsets and lag, failed messages, heartbeat.

The same dict feeds the CLI (text or --json) and the Dagster asset metadata.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog
from cdc_pipeline.state.schema import schema_exists
from cdc_pipeline.state.store import Store


def collect(config: PipelineConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"slot": None, "log": None, "sinks": {}}
    with psycopg.connect(config.source.dsn, autocommit=True) as src:
        slot = catalog.slot_info(src, config.source.slot)
    with psycopg.connect(config.state_dsn, autocommit=True) as conn:
        if not schema_exists(conn, config.state.schema_name):
            out["error"] = "state schema missing: run `cdc-pipeline setup`"
            return out
        s = sql.Identifier(config.state.schema_name)
        progress = conn.execute(sql.SQL(
            "SELECT committed_lsn, last_commit_ts, last_heartbeat_at, "
            "extract(epoch FROM now() - last_heartbeat_at)::float8 FROM {}.slot_progress WHERE slot = %s"
        ).format(s), (config.source.slot,)).fetchone()
        if slot is not None:
            lag_bytes = int(slot["lag_bytes"] or 0)
            out["slot"] = {
                "name": config.source.slot, "active": slot["active"],
                "confirmed_flush_lsn": slot["confirmed_flush_lsn"],
                "lag_bytes": lag_bytes, "retained_bytes": int(slot["retained_bytes"] or 0),
                # No WAL waiting means no lag, however long ago the last heartbeat was.
                "lag_seconds": round(progress[3], 3) if progress and progress[3] is not None and lag_bytes > 0
                else 0.0,
                "last_heartbeat_at": progress[2].isoformat() if progress and progress[2] else None,
            }
        row = conn.execute(sql.SQL(
            "SELECT count(*), (SELECT pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = 'change_log'), max(commit_lsn) "
            "FROM {}.change_log"
        ).format(s), (config.state.schema_name,)).fetchone()
        assert row is not None
        out["log"] = {"messages": int(row[0]), "bytes": int(row[1]), "head_lsn": row[2]}
        store = Store(config.state.schema_name)
        for sink in config.sinks:
            offset = conn.execute(sql.SQL(
                "SELECT commit_lsn, commit_idx, delivered, filtered, updated_at FROM {}.sink_offsets WHERE sink = %s"
            ).format(s), (sink.name,)).fetchone()
            pos = (int(offset[0]), int(offset[1])) if offset else (0, -1)
            failed = store.failed_summary(conn, sink.name)
            out["sinks"][sink.name] = {
                "offset": f"{pos[0]}:{pos[1]}",
                "lag_messages": store.count_after(conn, sink.tables, pos, sink=sink.name),
                "delivered": int(offset[2]) if offset else 0,
                "filtered": int(offset[3]) if offset else 0,
                **failed,
                "updated_at": offset[4].isoformat() if offset else None,
            }
        out["backfills"], out["backfills_text"] = _backfills(config, conn)
    return out


def _backfills(config: PipelineConfig, conn: psycopg.Connection) -> tuple[list[dict[str, Any]], list[str]]:
    """Active backfills with progress and checkpoints, and those that finished in the last day."""
    from cdc_pipeline.backfill.cli import describe
    from cdc_pipeline.backfill.state import ACTIVE, BackfillStore

    found = conn.execute("SELECT to_regclass(format('%%I.backfills', %s::text))", (config.state.schema_name,)).fetchone()
    if not found or found[0] is None:
        return [], []  # state schema from before backfills: `cdc-pipeline setup` adds them
    day_ago = datetime.now(UTC) - timedelta(days=1)
    infos = [i for i in BackfillStore(config.state.schema_name).list(conn, limit=20)
             if i.status in ACTIVE or (i.finished_at is not None and i.finished_at > day_ago)]
    return [i.as_dict() for i in infos], ["backfill " + describe(i) for i in infos]


def render(status: dict[str, Any]) -> str:
    lines: list[str] = []
    if status.get("error"):
        return f"error: {status['error']}"
    slot = status["slot"]
    if slot:
        lines.append(f"slot {slot['name']}: lag {slot['lag_bytes']} bytes, {slot['lag_seconds']} s; "
                     f"confirmed {slot['confirmed_flush_lsn']}; last heartbeat {slot['last_heartbeat_at']}")
    else:
        lines.append("slot: missing (run `cdc-pipeline setup`)")
    log = status["log"]
    lines.append(f"log: {log['messages']} messages, {log['bytes']} bytes")
    for name, s in status["sinks"].items():
        lines.append(f"sink {name}: offset {s['offset']}, lag {s['lag_messages']} messages, delivered "
                     f"{s['delivered']}, parked {s['parked']}, discarded {s['discarded']}")
    for line in status.get("backfills_text", []):
        lines.append(line)
    return "\n".join(lines)
