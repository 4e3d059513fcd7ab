"""Typed reads in the state database: the row types that parse them, and their JSON for consumers that need it.

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
import pyarrow as pa
import pyarrow.compute as pc
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


def shapes_of(conn: psycopg.Connection, schema: str, batch: pa.Table) -> dict[str, Columns]:
    """The shapes of the typed reads in a log batch loaded with its typed rows."""
    if "tup" not in batch.column_names or batch.column("tup").null_count == batch.num_rows:
        return {}
    ids = pc.unique(pc.filter(batch.column("backfill_id"), pc.is_valid(batch.column("tup")))).to_pylist()
    return shapes(conn, schema, [str(i) for i in ids])



def with_records(conn: psycopg.Connection, schema: str, batch: pa.Table) -> pa.Table:
    """A log batch loaded with its typed rows, as every consumer of JSON wants it: each typed read's record
    made from its typed row (one set-wise ``to_jsonb`` per row type, not a per-row dynamic cast), and no
    ``tup`` column."""
    tup = batch.column("tup")
    out = batch.drop_columns(["tup"])
    if tup.null_count == batch.num_rows:
        return out
    has_tup = pc.is_valid(tup)
    ids = [str(i) for i in pc.unique(pc.filter(batch.column("backfill_id"), has_tup)).to_pylist()]
    by_type: dict[str, list[str]] = {}
    for bid, columns in shapes(conn, schema, ids).items():
        by_type.setdefault(shape_name(columns), []).append(bid)
    lsn, idx = batch.column("commit_lsn"), batch.column("commit_idx")
    first, last = (lsn[0].as_py(), idx[0].as_py()), (lsn[-1].as_py(), idx[-1].as_py())
    made: dict[tuple[int, int], str] = {}
    for name, bids in by_type.items():
        rows = conn.execute(sql.SQL(
            "SELECT commit_lsn, commit_idx, to_jsonb(tup::{})::text FROM {}.change_log "
            "WHERE (commit_lsn, commit_idx) >= (%s, %s) AND (commit_lsn, commit_idx) <= (%s, %s) "
            "AND backfill_id = ANY(%s) AND tup IS NOT NULL").format(sql.Identifier(schema, name), sql.Identifier(schema)),
            (*first, *last, bids)).fetchall()
        made.update({(int(a), int(b)): str(j) for a, b, j in rows})
    positions = zip(lsn.to_pylist(), idx.to_pylist(), has_tup.to_pylist(), strict=True)
    records = pa.array([made[(a, b)] if typed else None for a, b, typed in positions], pa.string())
    record = pc.if_else(has_tup, records, batch.column("record"))
    return out.set_column(out.schema.get_field_index("record"), "record", record)
