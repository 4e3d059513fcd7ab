"""Typed reads in the state database: the row types that parse them (their JSON in a log batch: typed_records.py).

A typed read carries the row as PostgreSQL's composite text (``ROW(...)::text``, ``tup``) instead of a
``to_jsonb`` record. Its columns (name and destination type, in the source table's order) are recorded on
the backfill with a composite type of the same shape in the state schema, named after a hash of the shape
so backfills of one table share it. ``to_jsonb`` of the text cast to that type is what ``to_jsonb`` of the
source row gave: the types are the source's own built-in types (enums read as text, whose JSON is the same
string), and the text was written with fixed output settings (postgres/session.py: UTC, ISO dates).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import psycopg
from psycopg import sql

# (column name, type as SQL): the shape of one backfill's typed reads.
Columns = tuple[tuple[str, str], ...]


def shape_name(columns: Columns) -> str:
    """A name for the row type of ``columns``, the same for the same shape (types from the catalog's
    ``format_type``, names from the table: hashed, so neither reaches an identifier unquoted)."""
    digest = hashlib.sha256(json.dumps(columns).encode()).hexdigest()[:20]
    return f"typed_row_{digest}"


def ensure_row_type(conn: psycopg.Connection, schema: str, columns: Columns) -> str:
    """Create the composite type of ``columns`` in the state schema if missing; its qualified, quoted name."""
    ident = sql.Identifier(schema, shape_name(columns))
    body = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(type_sql))
                              for name, type_sql in columns)
    with conn.transaction():
        # Two backfills of one table may create it at once: one at a time, then look again.
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"cdc_pipeline.typed:{schema}",))
        row = conn.execute("SELECT to_regtype(%s)", (ident.as_string(conn),)).fetchone()
        if row is None or row[0] is None:
            conn.execute(sql.SQL("CREATE TYPE {} AS ({})").format(ident, body))
    return ident.as_string(conn)


def record_shape(conn: psycopg.Connection, schema: str, backfill_id: str, type_name: str,
                 columns: Columns) -> tuple[str, Columns] | None:
    """Record the typed shape of a backfill once (a resumed run keeps the first); the shape it has."""
    with conn.transaction():
        conn.execute(sql.SQL("UPDATE {}.backfills SET typed_type = %s, typed_columns = %s WHERE id = %s "
                             "AND typed_type IS NULL").format(sql.Identifier(schema)),
                     (type_name, json.dumps([list(c) for c in columns]), backfill_id))
        row = conn.execute(sql.SQL("SELECT typed_type, typed_columns FROM {}.backfills WHERE id = %s")
                           .format(sql.Identifier(schema)), (backfill_id,)).fetchone()
    if row is None or row[0] is None:
        return None
    return str(row[0]), tuple((str(n), str(t)) for n, t in row[1])


def shapes(conn: psycopg.Connection, schema: str, backfill_ids: Sequence[str]) -> dict[str, Columns]:
    """The typed shapes of these backfills."""
    rows = conn.execute(sql.SQL("SELECT id, typed_columns FROM {}.backfills WHERE id = ANY(%s) "
                                "AND typed_columns IS NOT NULL").format(sql.Identifier(schema)),
                        (list(backfill_ids),)).fetchall()
    return {str(bid): tuple((str(n), str(t)) for n, t in cols) for bid, cols in rows}
