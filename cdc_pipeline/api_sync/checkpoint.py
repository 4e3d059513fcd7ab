"""Per-collection sync state in the state database: phase, the adapter's cursor, counters, lag.

The collection's signature (destination, id and cursor fields, selected fields and types) is stored with
it: a change (a new collection, an added field) resets that collection alone to a fresh backfill.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from cdc_pipeline.config.api_sources import ApiCollectionConfig, ApiSourceConfig

RECENT_LAGS = 50


def signature(source: ApiSourceConfig, coll: ApiCollectionConfig) -> str:
    shape = [source.type, source.base_url, coll.table, coll.id_field, coll.cursor_field, coll.path,
             sorted(coll.fields.items())]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]


@dataclass
class Checkpoint:
    source: str
    collection: str
    signature: str
    phase: str = "backfill"
    state: dict[str, Any] = field(default_factory=dict)
    backfill_records: int = 0
    backfill_total: int | None = None
    backfill_started_at: datetime | None = None
    backfill_done_at: datetime | None = None
    records_synced: int = 0
    records_deleted: int = 0
    requests: int = 0
    synced_as_of: datetime | None = None
    recent_lags: list[float] = field(default_factory=list)
    last_delete_check_at: datetime | None = None
    last_error: str | None = None


_COLUMNS = [f for f in Checkpoint.__dataclass_fields__ if f not in ("source", "collection")]


def load(conn: psycopg.Connection, schema: str, source: ApiSourceConfig, coll: ApiCollectionConfig) -> Checkpoint:
    """The collection's checkpoint; a new one (a backfill from scratch) when absent or its shape changed."""
    sig = signature(source, coll)
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(sql.SQL("SELECT * FROM {}.api_sync_collections WHERE source = %s AND collection = %s")
                          .format(sql.Identifier(schema)), (source.name, coll.name)).fetchone()
    if row is not None and row["signature"] == sig:
        return Checkpoint(**{k: row[k] for k in ("source", "collection", *_COLUMNS)})
    cp = Checkpoint(source.name, coll.name, sig)
    now = conn.execute("SELECT now()").fetchone()
    cp.backfill_started_at = now[0] if now else None
    # Keep the lifetime counters; everything about the cursor starts again.
    if row is not None:
        cp.records_synced, cp.records_deleted, cp.requests = (row["records_synced"], row["records_deleted"],
                                                              row["requests"])
    save(conn, schema, cp)
    return cp


def save(conn: psycopg.Connection, schema: str, cp: Checkpoint) -> None:
    values = [Jsonb(getattr(cp, c)) if c == "state" else getattr(cp, c) for c in _COLUMNS]
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMNS)
    conn.execute(sql.SQL(
        "INSERT INTO {s}.api_sync_collections (source, collection, {cols}, updated_at) "
        "VALUES (%s, %s, {ph}, now()) ON CONFLICT (source, collection) DO UPDATE SET ({cols}, updated_at) = "
        "(SELECT {excluded}, now())").format(
            s=sql.Identifier(schema), cols=cols, ph=sql.SQL(", ").join([sql.Placeholder()] * len(_COLUMNS)),
            excluded=sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(sql.Identifier(c)) for c in _COLUMNS)),
        [cp.source, cp.collection, *values])


def add_lag(cp: Checkpoint, seconds: float) -> None:
    cp.recent_lags = [*cp.recent_lags, round(seconds, 3)][-RECENT_LAGS:]
