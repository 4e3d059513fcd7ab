"""The destination table of a collection: ``id`` (text key), ``modified_at`` (the cursor), one typed
column per selected field, the whole record as ``record jsonb``, and ``synced_at``.

Upserts change a row only when the record differs and is not older than what the row holds, so a page
fetched twice (after a crash, a tie) leaves no trace in the table or in the CDC stream that follows it.
"""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cdc_pipeline.api_sync.adapters import Adapter
from cdc_pipeline.config.api_sources import ApiCollectionConfig
from cdc_pipeline.postgres import catalog

_CHUNK = 1000


def _table(coll: ApiCollectionConfig) -> sql.Identifier:
    schema, _, name = coll.table.partition(".")
    return sql.Identifier(schema, name)


def ensure_table(conn: psycopg.Connection, coll: ApiCollectionConfig) -> None:
    """Create the table, add columns for new fields, retype changed ones (the backfill refills them)."""
    with conn.transaction():
        # Two processes starting together would race on CREATE TABLE IF NOT EXISTS (pg_type conflict).
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"cdc_pipeline.api_table:{coll.table}",))
        _ensure_table(conn, coll)


def _ensure_table(conn: psycopg.Connection, coll: ApiCollectionConfig) -> None:
    schema, _, name = coll.table.partition(".")
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, modified_at timestamptz, record jsonb NOT NULL, "
        "synced_at timestamptz NOT NULL DEFAULT now())").format(_table(coll)))
    existing = catalog.column_types(conn, schema, name)
    for column, (_, kind) in coll.columns.items():
        if column not in existing:
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                _table(coll), sql.Identifier(column), sql.SQL(kind)))  # kind: from the config's allow-list
        elif existing[column] != kind and not (kind == "timestamptz" and existing[column].startswith("timestamp")):
            conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING NULL").format(
                _table(coll), sql.Identifier(column), sql.SQL(kind)))


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float):  # epoch milliseconds (HubSpot-style)
        return datetime.fromtimestamp(value / 1000).astimezone()
    text = str(value).replace("Z", "+00:00")
    if text.isdigit():
        return datetime.fromtimestamp(int(text) / 1000).astimezone()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def typed(value: Any, kind: str) -> Any:
    """The API value as the column's type; None (the jsonb record keeps it) when it doesn't fit."""
    if value is None:
        return None
    try:
        if kind == "jsonb":
            return Jsonb(value)
        if kind == "text":
            return value if isinstance(value, str) else json.dumps(value)
        if kind in ("integer", "bigint"):
            return int(Decimal(str(value))) if Decimal(str(value)) % 1 == 0 else None
        if kind == "numeric":
            return Decimal(str(value))
        if kind == "double precision":
            return float(value)
        if kind == "boolean":
            return value if isinstance(value, bool) else {"true": True, "false": False}.get(str(value).lower())
        if kind == "timestamptz":
            return _time(value)
        if kind == "date":
            return date.fromisoformat(str(value)[:10])
    except (ValueError, TypeError, ArithmeticError, InvalidOperation):
        return None
    return None


def upsert(conn: psycopg.Connection, coll: ApiCollectionConfig, adapter: Adapter,
           records: list[dict[str, Any]]) -> int:
    """Insert or update ``records``; returns the number of rows that changed.

    A row is rewritten when its record or any typed column differs: after a field is added, the
    backfill fills the new column even where the API's record itself is unchanged."""
    columns = coll.columns
    names = [sql.Identifier(c) for c in ("id", "modified_at", "record", *columns)]
    casts = [sql.SQL("%s::text"), sql.SQL("%s::timestamptz"), sql.SQL("%s::jsonb"),
             *(sql.SQL("%s::" + kind) for _, kind in columns.values())]
    updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(n) for n in names[1:])
    changed = 0
    by_id = {adapter.record_id(coll, r): r for r in records}  # one row per id per statement
    items = list(by_id.items())
    for start in range(0, len(items), _CHUNK):
        chunk = items[start:start + _CHUNK]
        row = sql.SQL("({})").format(sql.SQL(", ").join(casts))
        query = sql.SQL(
            "INSERT INTO {t} AS t ({cols}) VALUES {rows} ON CONFLICT (id) DO UPDATE SET {updates}, "
            "synced_at = now() WHERE ({old}) IS DISTINCT FROM ({new}) AND "
            "(t.modified_at IS NULL OR EXCLUDED.modified_at IS NULL OR t.modified_at <= EXCLUDED.modified_at)"
        ).format(t=_table(coll), cols=sql.SQL(", ").join(names), rows=sql.SQL(", ").join([row] * len(chunk)),
                 updates=updates, old=sql.SQL(", ").join(sql.SQL("t.{}").format(n) for n in names[1:]),
                 new=sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(n) for n in names[1:]))
        params: list[Any] = []
        for rid, rec in chunk:
            params += [rid, _time(adapter.value(coll, rec, coll.cursor_field)), Jsonb(rec)]
            params += [typed(adapter.value(coll, rec, field), kind) for field, kind in columns.values()]
        changed += conn.execute(query, params).rowcount
    return changed


def delete(conn: psycopg.Connection, coll: ApiCollectionConfig, ids: list[str]) -> int:
    if not ids:
        return 0
    return conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(_table(coll)), (ids,)).rowcount


def unseen(conn: psycopg.Connection, coll: ApiCollectionConfig, seen: set[str], before: datetime) -> set[str]:
    """After a full id sweep: rows the sweep did not see, and that were not written since it started."""
    return {r[0] for r in conn.execute(sql.SQL("SELECT id FROM {} WHERE synced_at < %s AND NOT (id = ANY(%s))")
                                       .format(_table(coll)), (before, list(seen))).fetchall()}
