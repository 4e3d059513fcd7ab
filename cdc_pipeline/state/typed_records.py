"""Typed reads in a log batch loaded as Arrow (state/typed_rows.py holds their row types): the shapes a batch
holds, and the batch as every consumer of JSON wants it, each typed read's record made from its typed row."""

from __future__ import annotations

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from cdc_pipeline.state.typed_rows import Columns, shape_name, shapes


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
