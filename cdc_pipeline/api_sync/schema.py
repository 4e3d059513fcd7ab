"""State tables of API sync (in the pipeline's state schema), created idempotently.

Kept apart from state/schema.py's numbered migrations so API sync stays self-contained: every statement
is `IF NOT EXISTS`, run under the same advisory lock as the state schema's migrations.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc_pipeline.postgres import catalog

DDL = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.api_sync_budget (
    source         text PRIMARY KEY,
    next_slot      double precision NOT NULL DEFAULT 0,   -- epoch seconds (DB clock) of the next free slot
    paused_until   double precision NOT NULL DEFAULT 0,   -- 429 / quota headers: nobody sends before this
    quota_requests integer,                               -- the quota as the API reports it, if it does
    quota_seconds  double precision,
    factor         double precision NOT NULL DEFAULT 1,   -- < 1 slows the schedule (quota headers)
    requests       bigint NOT NULL DEFAULT 0,
    throttled      bigint NOT NULL DEFAULT 0,             -- 429 responses
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {s}.api_sync_requests (
    source     text NOT NULL,
    collection text NOT NULL,
    at         double precision NOT NULL
);
CREATE INDEX IF NOT EXISTS api_sync_requests_at ON {s}.api_sync_requests (source, at);
CREATE TABLE IF NOT EXISTS {s}.api_sync_workers (
    source       text NOT NULL,
    worker       text NOT NULL,
    pid          integer,                                -- its state connection's backend: alive or not
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, worker)
);
CREATE TABLE IF NOT EXISTS {s}.api_sync_collections (
    source          text NOT NULL,
    collection      text NOT NULL,
    signature       text NOT NULL,
    phase           text NOT NULL DEFAULT 'backfill',     -- backfill | sync
    state           jsonb NOT NULL DEFAULT '{{}}',          -- the adapter's cursor (keyset, page token, ties)
    backfill_records bigint NOT NULL DEFAULT 0,
    backfill_total  bigint,
    backfill_started_at timestamptz,
    backfill_done_at timestamptz,
    records_synced  bigint NOT NULL DEFAULT 0,
    records_deleted bigint NOT NULL DEFAULT 0,
    requests        bigint NOT NULL DEFAULT 0,
    pass_started_at timestamptz,                          -- first request of the current pass
    synced_as_of    timestamptz,                          -- start of the last completed pass
    recent_lags     double precision[] NOT NULL DEFAULT '{{}}',
    last_delete_check_at timestamptz,
    last_error      text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, collection)
);
"""


def ensure_api_schema(conn: psycopg.Connection, schema: str) -> None:
    """Create the API sync state tables if missing; safe to call from setup and every sync start."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"cdc_pipeline.schema:{schema}",))
        conn.execute(sql.SQL(DDL).format(s=sql.Identifier(schema)))


def api_schema_exists(conn: psycopg.Connection, schema: str) -> bool:
    return catalog.table_exists(conn, schema, "api_sync_collections")
