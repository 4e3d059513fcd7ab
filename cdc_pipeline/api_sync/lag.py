"""Max lag and the per-collection figures that `status`, the Dagster assets and checks show.

Computed max lag (the seed's figure): the budget allows one request every ``interval`` seconds, shared
round-robin by the ``n`` collections of a source, so each collection is asked for changes once every
``n x interval`` seconds, and a change made just after one poll started is in the table when the next
poll finishes: ``n x interval`` (plus one request's duration). Where deletes are found by a periodic
listing (REST full id sweep, HubSpot archived objects), a round also carries one page of it while a
check runs: ``(n + 1) x interval``. Observed lag: for every completed poll,
the time from the start of the previous completed poll to the end of this one (what a change made right
after that start waited at most); current lag: now minus the start of the last completed poll (the
table holds everything changed before that).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cdc_pipeline.api_sync.adapters import ADAPTERS
from cdc_pipeline.api_sync.budget import Quota
from cdc_pipeline.api_sync.schema import api_schema_exists
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.config.api_sources import ApiSourceConfig
from cdc_pipeline.postgres import session


def computed_max_lag(collections: int, quota: Quota, factor: float = 1.0, sweeps: bool = False) -> float:
    """One round: every collection's poll, plus one delete-check page when the API needs sweeps."""
    return (collections + int(sweeps)) * quota.interval(factor)


def lag_ceiling(source: ApiSourceConfig, computed: float) -> float:
    """The asset check's limit: configured, else twice the computed max lag (room for backfill pages)."""
    return source.max_lag_seconds if source.max_lag_seconds is not None else 2 * computed


def collect(config: PipelineConfig, conn: psycopg.Connection | None = None) -> dict[str, Any]:
    """Per source and collection: phase, backfill progress, records, requests used / budget, lag."""
    if not config.api_sources:
        return {}
    if conn is None:
        with session.connect(config.state_dsn, autocommit=True) as own:
            return collect(config, own)
    schema = config.state.schema_name
    if not api_schema_exists(conn, schema):
        return {s.name: {"error": "api sync state missing: run `cdc-pipeline setup` or `api-sync`"}
                for s in config.api_sources}
    s = sql.Identifier(schema)
    now = datetime.now(UTC)
    with conn.cursor(row_factory=dict_row) as cur:
        return {source.name: _source_figures(cur, s, source, now) for source in config.api_sources}


def _source_figures(cur: psycopg.Cursor[dict[str, Any]], s: sql.Identifier, source: ApiSourceConfig,
                    now: datetime) -> dict[str, Any]:
    budget = cur.execute(sql.SQL("SELECT *, extract(epoch FROM clock_timestamp())::float8 AS now "
                                 "FROM {}.api_sync_budget WHERE source = %s").format(s), (source.name,)).fetchone()
    rl = source.rate_limit
    quota = Quota(rl.requests, rl.per_seconds, rl.share)
    if budget and budget["quota_requests"] and budget["quota_seconds"]:
        reported = Quota(budget["quota_requests"], budget["quota_seconds"], rl.share)
        if reported.budget / reported.seconds < quota.budget / quota.seconds:
            quota = reported
    factor = float(budget["factor"]) if budget else 1.0
    used = 0
    if budget:
        row = cur.execute(sql.SQL("SELECT count(*) AS n FROM {}.api_sync_requests WHERE source = %s "
                                  "AND at > %s AND at <= %s").format(s),
                          (source.name, budget["now"] - quota.seconds, budget["now"])).fetchone()
        used = int(row["n"]) if row else 0
    computed = computed_max_lag(len(source.collections), quota, factor, ADAPTERS[source.type].sweeps)
    rows = {r["collection"]: r for r in cur.execute(sql.SQL(
        "SELECT * FROM {}.api_sync_collections WHERE source = %s").format(s), (source.name,)).fetchall()}
    return {
        "type": source.type,
        "requests_in_window": used,
        "budget_per_window": quota.budget,
        "window_seconds": quota.seconds,
        "request_interval_seconds": round(quota.interval(factor), 3),
        "factor": factor,
        # A pause stored beyond the cap (an older version) is held to it at the next request.
        "paused_for_seconds": round(min(max(0.0, budget["paused_until"] - budget["now"]),
                                        rl.max_retry_after_seconds), 3) if budget else 0.0,
        "max_retry_after_seconds": rl.max_retry_after_seconds,
        "throttled": int(budget["throttled"]) if budget else 0,
        "computed_max_lag_seconds": round(computed, 3),
        "max_lag_ceiling_seconds": round(lag_ceiling(source, computed), 3),
        "collections": {coll.name: _collection_figures(coll.table, rows.get(coll.name), now)
                        for coll in source.collections},
    }


def _collection_figures(table: str, r: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
    """One collection's row of api_sync_collections (None: not started) as figures."""
    lags = list(r["recent_lags"]) if r else []
    total = r["backfill_total"] if r else None
    done = r["backfill_records"] if r else 0
    return {
        "table": table,
        "phase": r["phase"] if r else "not started",
        "backfill_records": done,
        "backfill_total": total,
        "backfill_progress": (1.0 if r and r["phase"] == "sync" else
                              round(min(1.0, done / total), 4) if total else None),
        "records_synced": r["records_synced"] if r else 0,
        "records_deleted": r["records_deleted"] if r else 0,
        "requests": r["requests"] if r else 0,
        "lag_seconds": round((now - r["synced_as_of"]).total_seconds(), 3) if r and r["synced_as_of"] else None,
        "observed_max_lag_seconds": max(lags) if lags else None,
        "last_error": r["last_error"] if r else None,
    }


def render(figures: dict[str, Any]) -> list[str]:
    lines = []
    for name, src in figures.items():
        if "error" in src:
            lines.append(f"api source {name}: {src['error']}")
            continue
        lines.append(f"api source {name} ({src['type']}): {src['requests_in_window']}/{src['budget_per_window']} "
                     f"requests in the last {src['window_seconds']:g} s; max lag {src['computed_max_lag_seconds']} s "
                     f"(ceiling {src['max_lag_ceiling_seconds']} s)" + (
                         f"; paused for {src['paused_for_seconds']:g} s (the API's Retry-After or quota, "
                         f"at most {src['max_retry_after_seconds']:g} s)" if src["paused_for_seconds"] > 0 else ""))
        for cname, c in src["collections"].items():
            progress = "" if c["phase"] != "backfill" else (
                f" {c['backfill_records']}/{c['backfill_total'] or '?'}")
            lines.append(f"  {cname} -> {c['table']}: {c['phase']}{progress}, {c['records_synced']} synced, "
                         f"{c['records_deleted']} deleted, lag {c['lag_seconds']} s (observed max "
                         f"{c['observed_max_lag_seconds']} s)" + (f"; error: {c['last_error']}" if c["last_error"] else ""))
    return lines
