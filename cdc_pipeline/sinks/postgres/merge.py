"""A mirror's JSON messages applied set-wise: a segment of one table's staged messages (``_cdc_stage``, between
two truncates or schema changes) becomes its effects per key, applied in layers by MERGE.

Per primary key, everything before the key's last full-state message (insert, read, delete, an update carrying
every column) is superseded and skipped; what remains is applied in "layers" (the n-th remaining message of
every key in the n-th MERGE), so per-key order holds. An update that changes the key first deletes the old key.
Columns left out of a record (unchanged TOAST values) keep their value."""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc_pipeline.postgres.catalog import ColumnInfo, TableInfo
from cdc_pipeline.postgres.compose import execute
from cdc_pipeline.postgres.oids import FIRST_USER_OID

# A row stream's message (delivery/rows.py) has no action: a row, or a deleted row's key.
ROW_ACTION = sql.SQL("coalesce(s.msg->>'action', CASE WHEN s.msg->'deleted' = 'true' THEN 'delete' ELSE 'read' END)")


def column_type(column: ColumnInfo) -> sql.Composable:
    """A mirror column's type. From the source's own catalog (format_type), never user input; user types
    recorded without a mirror_type: text."""
    if column.mirror_type or column.type_oid < FIRST_USER_OID:
        return sql.SQL(column.mirror_type or column.type_sql)
    return sql.SQL("text[]" if column.type_sql.endswith("[]") else "text")


def mirror_segment(conn: psycopg.Connection, target: tuple[str, str], info: TableInfo, schema: str, name: str,
                   lo: int, hi: int) -> None:
    """Apply the staged messages of ``schema.name`` with seq in [lo, hi) to the mirror table ``target``."""
    layers = _effects(conn, info, schema, name, lo, hi)
    _merge_layers(conn, target, info, layers)


def _effects(conn: psycopg.Connection, info: TableInfo, schema: str, name: str, lo: int, hi: int) -> int:
    """``_cdc_effects``: what each key's messages of the segment still do, numbered in layers; how many layers."""
    pk = info.primary_key
    cols = [c.name for c in info.columns]
    pk_json = sql.SQL("jsonb_build_array({})").format(
        sql.SQL(", ").join(sql.SQL("rec -> {}").format(sql.Literal(k)) for k in pk))
    old_pk_json = sql.SQL("jsonb_build_array({})").format(sql.SQL(", ").join(
        sql.SQL("(s.msg->'record' || coalesce(nullif(s.msg->'changes', 'null'), '{{}}')) -> {}").format(sql.Literal(k))
        for k in pk))
    new_pk_json = sql.SQL("jsonb_build_array({})").format(
        sql.SQL(", ").join(sql.SQL("s.msg->'record' -> {}").format(sql.Literal(k)) for k in pk))
    where = sql.SQL(
        "s.msg->'metadata'->>'table_schema' = {} AND s.msg->'metadata'->>'table_name' = {} "
        "AND s.seq >= {} AND s.seq < {}").format(sql.Literal(schema), sql.Literal(name),
                                                 sql.Literal(lo), sql.Literal(hi))
    conn.execute("DROP TABLE IF EXISTS _cdc_effects")
    conn.execute(sql.SQL(
        "CREATE TEMP TABLE _cdc_effects ON COMMIT DROP AS "
        "WITH e AS ("
        "  SELECT s.seq * 2 AS seq, 'delete' AS kind, s.msg->'record' || coalesce(nullif(s.msg->'changes', 'null'), '{{}}') AS rec,"
        "         NULL::jsonb AS texts, true AS full_state"
        "  FROM _cdc_stage s WHERE {where} AND s.msg->>'action' = 'update' AND {old_pk} <> {new_pk}"
        "  UNION ALL"
        "  SELECT s.seq * 2 + 1, CASE WHEN {action} = 'delete' THEN 'delete' ELSE 'upsert' END,"
        "         s.msg->'record', nullif(s.msg->'texts', 'null'), {action} = 'delete' OR s.msg->'record' ?& {cols}"
        "  FROM _cdc_stage s WHERE {where} AND {action} IN ('insert', 'update', 'delete', 'read')"
        "), k AS (SELECT e.*, {pk_json} AS pkj FROM e),"
        " w AS (SELECT k.*, max(CASE WHEN full_state THEN seq END) OVER (PARTITION BY pkj) AS last_full FROM k)"
        " SELECT seq, kind, rec, texts, row_number() OVER (PARTITION BY pkj ORDER BY seq) AS layer"
        " FROM w WHERE seq >= coalesce(last_full, 0)"
    ).format(where=where, old_pk=old_pk_json, new_pk=new_pk_json, pk_json=pk_json,
             cols=sql.Literal(cols), action=ROW_ACTION))
    row = conn.execute("SELECT coalesce(max(layer), 0) FROM _cdc_effects").fetchone()
    return int(row[0]) if row else 0


def _merge_layers(conn: psycopg.Connection, target: tuple[str, str], info: TableInfo, layers: int) -> None:
    ident = sql.Identifier(*target)
    pk = info.primary_key
    cols = [c.name for c in info.columns]
    on = sql.SQL(" AND ").join(sql.SQL("t.{k} = s.{k}").format(k=sql.Identifier(k)) for k in pk)
    assign = sql.SQL(", ").join(
        sql.SQL("{c} = CASE WHEN s._cdc_rec ? {name} THEN s.{c} ELSE t.{c} END").format(
            c=sql.Identifier(c), name=sql.Literal(c)) for c in cols if c not in pk)
    col_list = sql.SQL(", ").join(map(sql.Identifier, cols))
    values = sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(c)) for c in cols)
    # A value the log also holds as text (capture/changes.py: texts) is taken from its text, exactly; the
    # rest from the record's JSON (without those columns, whose JSON need not fit the mirror's type).
    exact = sql.SQL(", ").join(
        sql.SQL("CASE WHEN e.texts ? {name} THEN (e.texts ->> {name})::{type} ELSE r.{c} END AS {c}").format(
            name=sql.Literal(c.name), type=column_type(c), c=sql.Identifier(c.name)) for c in info.columns)
    merge = sql.SQL(
        "MERGE INTO {t} t USING (SELECT e.kind AS _cdc_kind, e.rec AS _cdc_rec, {exact} FROM _cdc_effects e, "
        "jsonb_populate_record(NULL::{t}, CASE WHEN e.texts IS NULL THEN e.rec "
        "ELSE e.rec - ARRAY(SELECT jsonb_object_keys(e.texts)) END) r WHERE e.layer = %s) s ON {on} "
        "WHEN MATCHED AND s._cdc_kind = 'delete' THEN DELETE "
        + ("WHEN MATCHED THEN UPDATE SET {assign} " if cols != list(pk) else "")
        + "WHEN NOT MATCHED AND s._cdc_kind = 'upsert' THEN INSERT ({cols}) VALUES ({values})"
    ).format(t=ident, on=on, assign=assign, cols=col_list, values=values, exact=exact)
    for layer in range(1, layers + 1):
        execute(conn, merge, (layer,))
