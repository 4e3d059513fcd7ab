"""Lag figures and lag checks: the slot's (the change log asset) and each sink's (its sink asset).

Read every few seconds by the long-running drain and delivery runs, which record a check's evaluation
when its outcome or figure changed (defs/pacing.py), and by the sensors when no run is alive to do it,
so the UI's asset health shows a stalled pipeline within seconds of a check failing.
"""

from __future__ import annotations

from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
)

from cdc_pipeline.capture import source_server
from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.positions import Position, lsn_text, position_lsn_text
from cdc_pipeline.delivery.backlog import problem as backlog_problem
from cdc_pipeline.postgres import catalog, session
from cdc_pipeline.state import relations, slot_progress, stats
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.sink_offsets import SinkOffsets

SLOT_LAG_CHECK = "slot_lag_below_max"
SINK_LAG_CHECK = "lag_below_max"
PARKED_CHECK = "no_stale_parked_messages"
BACKLOG_LIMIT = 10_000_000  # counting a sink's backlog stops here: cheap enough to ask every few seconds


SLOT_LAG_DESCRIPTION = "The drain keeps up: the slot is at most drain.max_lag_seconds behind"


def slot_figures(pipeline: PipelineConfig) -> dict[str, Any]:
    """The slot's lag: WAL bytes not yet acknowledged, and (when there are any) seconds since the drain
    last committed to the log (it commits at least every heartbeat, so a live drain stays low)."""
    with session.connect(pipeline.source.dsn, autocommit=True) as src:
        slot = catalog.slot_info(src, pipeline.source.slot)
        server = source_server.identify(src)
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        committed, since_commit = slot_progress.heartbeat(conn, pipeline.state.schema_name, pipeline.source.slot)
        source = source_server.figures(server, source_server.load(conn, pipeline.state.schema_name,
                                                                  pipeline.source.slot))
    # Which server is read, and the failovers seen: as `status` says them.
    where = {"source_server": str(source["server"]), "source_failovers": source["failovers"],
             **({"source_last_failover": source["last_failover"]} if source["last_failover"] else {}),
             **({"committed_lsn": lsn_text(committed)} if committed is not None else {})}
    if slot is None:
        return {"slot": pipeline.source.slot, "slot_exists": False, **where}
    lag_bytes = int(slot["lag_bytes"] or 0)  # type: ignore[call-overload]
    lag_seconds = round(since_commit, 3) if lag_bytes > 0 and since_commit is not None else 0.0
    return {"slot": pipeline.source.slot, "slot_exists": True, "slot_active": bool(slot["active"]),
            "confirmed_flush_lsn": str(slot["confirmed_flush_lsn"]),
            "slot_lag_bytes": lag_bytes, "slot_retained_bytes": int(slot["retained_bytes"] or 0),  # type: ignore[call-overload]
            "slot_lag_seconds": lag_seconds, **where}


def log_head(pipeline: PipelineConfig, tables: list[str]) -> Position:
    """The change log's last position among `tables` (the change log asset's `log_head`)."""
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        return ChangeLog(pipeline.state.schema_name).log_head(conn, tables)


def log_rows(pipeline: PipelineConfig) -> int:
    """The rows in the change log (its `dagster/row_count`): counted once per materialization, at most once
    per drain.report_seconds; retention keeps the log bounded."""
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        return int(stats.log_stats(conn, pipeline.state.schema_name)["messages"])


def slot_check(pipeline: PipelineConfig, key: AssetKey, figures: dict[str, Any]) -> AssetCheckEvaluation:
    limit = pipeline.drain.max_lag_seconds
    exists = figures.get("slot_exists", False)
    lag = figures.get("slot_lag_seconds", 0.0)
    return AssetCheckEvaluation(
        asset_key=key, check_name=SLOT_LAG_CHECK, passed=bool(exists and lag <= limit),
        severity=AssetCheckSeverity.ERROR,
        description=None if exists else f"replication slot {pipeline.source.slot!r} does not exist",
        metadata={"slot_lag_seconds": lag, "slot_lag_bytes": figures.get("slot_lag_bytes", 0),
                  "max_lag_seconds": limit})


def sink_figures(pipeline: PipelineConfig, sink: SinkConfig) -> dict[str, Any]:
    schema = pipeline.state.schema_name
    offsets, change_log, failed = SinkOffsets(schema), ChangeLog(schema), FailedMessages(schema)
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        offset = offsets.sink_offset(conn, sink.name)
        age = change_log.oldest_age(conn, sink.tables, offset, sink=sink.name)
        backlog = change_log.backlog(conn, sink.tables, offset, sink.name, BACKLOG_LIMIT) if age is not None else 0
        delivered = offsets.delivered_total(conn, sink.name)
        parked = failed.failed_summary(conn, sink.name)
        changes = relations.schema_changes(conn, pipeline.state.schema_name)  # capture/schema_changes.py
    last = "; ".join(f"{t}: {c.get('summary')} (at {c.get('at')})" + (
        f" FINDING: its rows must be read again and no backfill could be started: run `{c['reread_blocked']['fix']}`"
        if c.get("reread_blocked") else "") for t, c in changes.items() if t in sink.tables)
    # `offset` is the sink's data version; `offset_lsn` (the same) is kept for those that read it.
    return {"offset": position_lsn_text(offset), "offset_lsn": position_lsn_text(offset), "lag_messages": backlog,
            "lag_seconds": round(age or 0.0, 3), "delivered_total": delivered,
            **parked, "backlog_error": backlog_problem(pipeline, sink, age),
            **({"last_schema_change": last} if last else {})}


def keeps_up(pipeline: PipelineConfig, figures: dict[str, Any]) -> bool:
    """Whether a sink keeps up with the change log: its oldest undelivered change is at most
    delivery.max_lag_seconds old and its backlog can be delivered (what lag_below_max checks, and what
    decides whether the UI reads the sink as synced: defs/versions.py)."""
    return bool(figures["lag_seconds"] <= pipeline.delivery.max_lag_seconds and not figures.get("backlog_error"))


def sink_checks(pipeline: PipelineConfig, key: AssetKey, figures: dict[str, Any], sink: str
                ) -> list[AssetCheckEvaluation]:
    limit = pipeline.delivery.max_lag_seconds
    return [
        AssetCheckEvaluation(
            asset_key=key, check_name=SINK_LAG_CHECK, passed=keeps_up(pipeline, figures),
            severity=AssetCheckSeverity.ERROR, description=figures.get("backlog_error"),
            metadata={"lag_seconds": figures["lag_seconds"], "lag_messages": figures["lag_messages"],
                      "max_lag_seconds": limit,
                      **({"stopped": figures["backlog_error"]} if figures.get("backlog_error") else {})}),
        parked_check(pipeline, key, figures, sink),
    ]


def parked_check(pipeline: PipelineConfig, key: AssetKey, figures: dict[str, Any], sink: str
                 ) -> AssetCheckEvaluation:
    """WARN as soon as a message is parked, ERROR once one is parked longer than max_parked_age_seconds;
    the parked messages themselves (the oldest PARKED_ROWS) as a table, with the IDs the retry and discard
    jobs take."""
    max_age = pipeline.delivery.max_parked_age_seconds
    parked, oldest = int(figures.get("parked") or 0), figures.get("oldest_parked_seconds") or 0.0
    stale = parked > 0 and oldest > max_age
    metadata: dict[str, Any] = {"parked": parked, "oldest_parked_seconds": float(oldest),
                                "max_parked_age_seconds": float(max_age)}
    if parked:
        metadata["parked_messages"] = parked_table(pipeline, sink)
    # No age in the text: a description that changes is a new evaluation to record (defs/pacing.py).
    what = (f"{parked} message(s) parked" + (f", the oldest longer than max_parked_age_seconds ({max_age:g} s)"
                                              if stale else "") +
            f": see parked_messages; retry or discard them with the jobs {failed_job_name('retry', sink)} / "
            f"{failed_job_name('discard', sink)}") if parked else None
    return AssetCheckEvaluation(
        asset_key=key, check_name=PARKED_CHECK, passed=parked == 0,
        severity=AssetCheckSeverity.ERROR if stale else AssetCheckSeverity.WARN, description=what,
        metadata=metadata)


PARKED_ROWS = 50  # the check's table shows this many (the oldest); `failed list` shows them all
PARKED_COLUMNS = [("id", "string", "message ID (commit_lsn:commit_idx): what the retry/discard jobs take"),
                  ("lsn", "string", "commit LSN (PostgreSQL notation) and index"),
                  ("table", "string", "source table"), ("key", "string", "the row's primary key"),
                  ("error", "string", "first line of the last error"), ("attempts", "int", "deliveries tried"),
                  ("age_seconds", "float", "parked for")]


def parked_table(pipeline: PipelineConfig, sink: str) -> MetadataValue:
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        rows = FailedMessages(pipeline.state.schema_name).parked_details(conn, sink, PARKED_ROWS)
    records = [TableRecord({
        "id": r["id"], "lsn": position_lsn_text((int(r["commit_lsn"]), int(r["commit_idx"]))),  # type: ignore[call-overload]
        "table": r["table"] or "", "key": str(r["key"] or ""),
        "error": str(r["last_error"]).strip().split("\n", 1)[0][:300], "attempts": int(r["attempts"]),  # type: ignore[call-overload]
        "age_seconds": round(float(r["age_seconds"] or 0.0), 1)}) for r in rows]  # type: ignore[arg-type]
    schema = TableSchema(columns=[TableColumn(n, t, description=d) for n, t, d in PARKED_COLUMNS])
    return MetadataValue.table(records, schema=schema)


def failed_job_name(action: str, sink: str) -> str:
    """The job that retries or discards a sink's failed messages (defs/failed.py)."""
    return f"{action}_failed_messages_{sink.replace('-', '_')}"


def failed_op_name(action: str, sink: str) -> str:
    """The op of that job, the key of its run config: ``ops: {retry_failed_<sink>: {config: {ids: [...]}}}``."""
    return f"{action}_failed_{sink.replace('-', '_')}"
