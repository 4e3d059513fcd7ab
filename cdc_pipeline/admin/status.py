"""`cdc-pipeline status`: slot lag, log size, sink offsets and lag, failed messages, heartbeat.

The same dict feeds the CLI (text or --json) and the Dagster asset metadata.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from cdc_pipeline.capture import source_server
from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.positions import position_lsn_text, position_text
from cdc_pipeline.delivery.backlog import problem as backlog_problem
from cdc_pipeline.postgres import catalog, session
from cdc_pipeline.sinks import sink_class
from cdc_pipeline.state import relations, stats
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.schema import schema_exists


def collect(config: PipelineConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"slot": None, "log": None, "sinks": {}}
    schema = config.state.schema_name
    try:
        with session.connect(config.source.dsn, autocommit=True) as src:
            slot = catalog.slot_info(src, config.source.slot)
            server = source_server.identify(src)
    except Exception as exc:
        exc.cdc_database = "source"  # type: ignore[attr-defined]  # /readyz names the database that failed
        raise
    with session.connect(config.state_dsn, autocommit=True) as conn:
        if not schema_exists(conn, schema):
            out["error"] = "state schema missing: run `cdc-pipeline setup`"
            if config.api_sources:  # `api-sync` keeps its own state tables: show them all the same
                from cdc_pipeline.api_sync import lag

                out["api_sync"] = lag.collect(config, conn)
            return out
        progress = stats.drain_progress(conn, schema, config.source.slot)
        out["source"] = source_server.figures(server, source_server.load(conn, schema, config.source.slot))
        if slot is not None:
            out["slot"] = _slot_figures(config, slot, progress)
        out["log"] = stats.log_stats(conn, schema)
        change_log, failed = ChangeLog(schema), FailedMessages(schema)
        for sink in config.sinks:
            out["sinks"][sink.name] = _sink_figures(config, sink, conn, change_log, failed)
        out["backfills"], out["backfills_text"] = _backfills(config, conn, slot)
        changes = relations.schema_changes(conn, schema)  # capture/schema_changes.py
        out["schema_changes"] = {t.qualified: changes[t.qualified] for t in config.tables if t.qualified in changes}
        if config.api_sources:
            from cdc_pipeline.api_sync import lag

            out["api_sync"] = lag.collect(config, conn)
    return out


def _slot_figures(config: PipelineConfig, slot: dict[str, Any], progress: dict[str, Any] | None) -> dict[str, Any]:
    lag_bytes = int(slot["lag_bytes"] or 0)
    age = progress["heartbeat_age_seconds"] if progress else None
    return {
        "name": config.source.slot, "active": slot["active"],
        "confirmed_flush_lsn": slot["confirmed_flush_lsn"],
        "lag_bytes": lag_bytes, "retained_bytes": int(slot["retained_bytes"] or 0),
        # No WAL waiting means no lag, however long ago the last heartbeat was.
        "lag_seconds": round(age, 3) if age is not None and lag_bytes > 0 else 0.0,
        "last_heartbeat_at": progress["last_heartbeat_at"].isoformat()
        if progress and progress["last_heartbeat_at"] else None,
    }


def _sink_figures(config: PipelineConfig, sink: SinkConfig, conn: psycopg.Connection, change_log: ChangeLog,
                  failed: FailedMessages) -> dict[str, Any]:
    schema = config.state.schema_name
    offset = stats.sink_offset_row(conn, schema, sink.name)
    pos = offset["position"] if offset else (0, -1)
    out: dict[str, Any] = {
        "offset": position_text(pos), "offset_lsn": position_lsn_text(pos),
        "lag_messages": change_log.count_after(conn, sink.tables, pos, sink=sink.name),
        "delivered": offset["delivered"] if offset else 0,
        "filtered": offset["filtered"] if offset else 0,
        "rows_read": offset["rows_read"] if offset else 0,  # log rows read, by all its lanes
        **failed.failed_summary(conn, sink.name),
        "updated_at": offset["updated_at"].isoformat() if offset else None,
        # Set while a running delivery waits for its destination to come back.
        "waiting_for_destination": offset["waiting_reason"] if offset else None,
        "waiting_since": offset["waiting_since"].isoformat() if offset and offset["waiting_since"] else None,
    }
    if offset and "lanes" in offset:  # core/lanes.py: each lane's own progress
        out["lanes"] = [{
            "lane": r["lane"], "offset": position_text(r["position"]),
            "offset_lsn": position_lsn_text(r["position"]), "delivered": r["delivered"],
            "rows_read": r["rows_read"],  # log rows this lane read: about 1/N of them when selected
            # Log messages after the lane's offset, all lanes' (an upper bound of its own).
            "behind_messages": change_log.count_after(conn, sink.tables, r["position"], sink=sink.name),
            "waiting_for_destination": r["waiting_reason"]} for r in offset["lanes"]]
    out.update(sink_class(sink).status(sink, conn, schema))
    age = change_log.oldest_age(conn, sink.tables, pos, sink=sink.name)
    # How old the oldest change not delivered yet is (0: caught up): what `lag_below_max` checks.
    out["lag_seconds"] = round(age, 3) if age is not None else 0.0
    stopped = backlog_problem(config, sink, age)
    if stopped:
        out["error"] = stopped
    return out


def _backfills(config: PipelineConfig, conn: psycopg.Connection,
               slot: dict[str, object] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Active backfills with progress and checkpoints, and those that finished in the last day. An active
    backfill whose staged pages wait while no process consumes the slot says so, with the fix."""
    from cdc_pipeline.backfill.progress import describe_backfill, no_drain_warning
    from cdc_pipeline.state.backfills import ACTIVE, BackfillStore

    if not stats.has_backfills(conn, config.state.schema_name):
        return [], []
    day_ago = datetime.now(UTC) - timedelta(days=1)
    store = BackfillStore(config.state.schema_name)
    infos = [i for i in store.list(conn, limit=20)
             if i.status in ACTIVE or (i.finished_at is not None and i.finished_at > day_ago)]
    consumed = bool(slot and slot["active"])
    drain_locked: bool | None = None
    dicts, text = [], []
    for info in infos:
        warning = ""
        if info.status in ACTIVE and info.pages_staged and not consumed:
            if drain_locked is None:
                drain_locked = store.drain_running(conn, config.source.slot)
            warning = no_drain_warning(config.source.slot, info.pages_staged, None, slot is not None, drain_locked)
        dicts.append({**info.as_dict(), "drain_warning": warning})
        text.append("backfill " + describe_backfill(info, warning))
    return dicts, text


def render(status: dict[str, Any]) -> str:
    lines: list[str] = []
    if status.get("error"):
        from cdc_pipeline.api_sync import lag

        return "\n".join([f"error: {status['error']}", *lag.render(status.get("api_sync") or {})])
    source = status.get("source")
    if source:
        lines.append(f"source: {source['server']}" + (
            f"; failovers {source['failovers']}, the last at {source['last_failover_at']}: {source['last_failover']}"
            if source["failovers"] else ""))
    slot = status["slot"]
    if slot:
        lines.append(f"slot {slot['name']}: lag {slot['lag_bytes']} bytes, {slot['lag_seconds']} s; "
                     f"confirmed {slot['confirmed_flush_lsn']}; last heartbeat {slot['last_heartbeat_at']}"
                     + ("" if slot["active"] else "; no process is consuming it (no drain running)"))
    else:
        lines.append("slot: missing (run `cdc-pipeline setup`)")
    log = status["log"]
    lines.append(f"log: {log['messages']} messages, {log['bytes']} bytes")
    for name, s in status["sinks"].items():
        lines.append(f"sink {name}: offset {s.get('offset_lsn', s['offset'])}, lag {s['lag_messages']} messages, delivered "
                     f"{s['delivered']}, parked {s['parked']}, discarded {s['discarded']}"
                     + (f"; waiting for the destination since {s['waiting_since']}: {s['waiting_for_destination']}"
                        if s.get("waiting_for_destination") else ""))
        if s.get("pull_queue"):
            q = s["pull_queue"]
            lines.append(f"  pull queue: {q['waiting']} waiting, {q['in_flight']} in flight, {q['parked']} parked")
        if s.get("error"):
            lines.append(f"ERROR: {s['error']}")
    for line in status.get("backfills_text", []):
        lines.append(line)
    lines += schema_change_lines(status.get("schema_changes") or {})
    if status.get("api_sync"):
        from cdc_pipeline.api_sync import lag

        lines += lag.render(status["api_sync"])
    return "\n".join(lines)


def schema_change_lines(changes: dict[str, dict[str, Any]]) -> list[str]:
    """Each table's last schema change, and a rename at the source as a finding with its fix."""
    lines = []
    for table, c in changes.items():
        lines.append(f"table {table}: last schema change at {c.get('at')}: {c.get('summary')}"
                     + (f"; its rows read again ({c['reread']})" if c.get("reread") else ""))
        if blocked := c.get("reread_blocked"):
            lines.append(f"FINDING: {table}: its rows must be read again ({blocked.get('why')}) and no backfill "
                         f"could be started ({blocked.get('error')}). Fix: `{blocked.get('fix')}`")
        if c.get("renamed_to"):
            lines.append(f"FINDING: {table} was renamed to {c['renamed_to']} at the source: its changes are still "
                         f"logged as {table}. Fix: name it {c['renamed_to']} in cdc.yaml (tables and sinks' tables), "
                         "then `cdc-pipeline setup`")
    return lines
