"""The `relations` table: each captured table's columns and key as the drain (or a backfill) last saw them."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cdc_pipeline.postgres.catalog import ColumnInfo, GeneratedColumn, TableInfo
from cdc_pipeline.postgres.pgtypeinfo import PgType, mirror_plan


def upsert_relation(conn: psycopg.Connection, schema: str, table_schema: str, table_name: str, relation_id: int,
                    replica_identity: str, columns: Sequence[dict[str, object]], primary_key: Sequence[str],
                    replace: bool = True) -> None:
    """Record a table's shape. ``replace=False`` only fills a missing row: a backfill describes a table
    from today's catalog, which must not overwrite what the drain learned from the stream."""
    on_conflict = sql.SQL(
        "DO UPDATE SET relation_id = excluded.relation_id, replica_identity = excluded.replica_identity, "
        "columns = excluded.columns, primary_key = excluded.primary_key, updated_at = now()"
    ) if replace else sql.SQL("DO NOTHING")
    conn.execute(sql.SQL(
        "INSERT INTO {}.relations (table_schema, table_name, relation_id, replica_identity, columns, primary_key, "
        "updated_at) VALUES (%s, %s, %s, %s, %s, %s, now()) ON CONFLICT (table_schema, table_name) {}"
    ).format(sql.Identifier(schema), on_conflict),
        (table_schema, table_name, relation_id, replica_identity, Jsonb(list(columns)), list(primary_key)))


def recorded_primary_key(conn: psycopg.Connection, schema: str, table_schema: str, table_name: str) -> tuple[str, ...]:
    """The primary key last recorded for a table (empty when none was)."""
    row = conn.execute(sql.SQL("SELECT primary_key FROM {}.relations WHERE table_schema = %s AND table_name = %s")
                       .format(sql.Identifier(schema)), (table_schema, table_name)).fetchone()
    return tuple(row[0]) if row and row[0] else ()


def relation_columns(conn: psycopg.Connection, schema: str) -> dict[str, list[dict[str, object]]]:
    """Each recorded table ("schema.table") with its columns, as column_record made them."""
    rows = conn.execute(sql.SQL("SELECT table_schema || '.' || table_name, columns FROM {}.relations")
                        .format(sql.Identifier(schema))).fetchall()
    return {r[0]: [c for c in r[1] if "generated" not in c] for r in rows}


def table_info(conn: psycopg.Connection, schema: str, table: str) -> TableInfo | None:
    """A recorded table ("schema.table") described as the catalog describes a table; None if unrecorded."""
    table_schema, _, name = table.partition(".")
    row = conn.execute(sql.SQL(
        "SELECT columns, primary_key, replica_identity FROM {}.relations "
        "WHERE table_schema = %s AND table_name = %s").format(sql.Identifier(schema)), (table_schema, name)).fetchone()
    if row is None:
        return None
    columns, pk, identity = row
    return TableInfo(table_schema, name, tuple(
        ColumnInfo(c["name"], c.get("type_sql") or "text", int(c["type_oid"]), False, c["name"] in pk,
                   c.get("mirror_type"))
        for c in columns if "generated" not in c), tuple(pk), identity or "d", generated=tuple(
        GeneratedColumn(c["name"], c["type_sql"], c["generated"], True) for c in columns if "generated" in c))


def column_record(name: str, type_oid: int, type_sql: str | None, key: bool,
                  types: dict[int, PgType]) -> dict[str, object]:
    """A column as the `relations` table records it, with the type a Postgres mirror gives it
    (postgres/pgtypeinfo.py: mirror_plan)."""
    t = types.get(type_oid)
    mirror = mirror_plan(t, type_sql).sql if t is not None and type_sql else None
    return {"name": name, "type_oid": type_oid, "key": key, "type_sql": type_sql, "mirror_type": mirror}


def generated_records(left_out: Sequence[GeneratedColumn]) -> list[dict[str, object]]:
    """Generated columns the stream leaves out, as the `relations` table records them beside the columns
    (a mirror defines them with the source's expression; readers of the columns skip them)."""
    return [{"name": g.name, "type_sql": g.type_sql, "generated": g.expression} for g in left_out]


def record_schema_change(conn: psycopg.Connection, schema: str, table_schema: str, table_name: str,
                         change: dict[str, object]) -> None:
    """A table's last schema change (a row is made if the table has none yet)."""
    conn.execute(sql.SQL(
        "INSERT INTO {}.relations (table_schema, table_name, columns, last_schema_change) VALUES (%s, %s, '[]', %s) "
        "ON CONFLICT (table_schema, table_name) DO UPDATE SET last_schema_change = excluded.last_schema_change"
    ).format(sql.Identifier(schema)), (table_schema, table_name, Jsonb(change)))


def record_reread_blocked(conn: psycopg.Connection, schema: str, table_schema: str, table_name: str,
                          why: str, error: str) -> None:
    """A re-read the table's last schema change needs could not be started (rereads.py): kept until a full
    backfill of the table registered after it completes (``schema_changes``)."""
    conn.execute(sql.SQL(
        "UPDATE {}.relations SET last_schema_change = coalesce(last_schema_change, '{{}}') || jsonb_build_object("
        "'reread_blocked', jsonb_build_object('why', %s::text, 'error', %s::text, 'since', now(), "
        "'fix', format('cdc-pipeline backfill %%s', %s::text))) WHERE table_schema = %s AND table_name = %s"
    ).format(sql.Identifier(schema)), (why, error, f"{table_schema}.{table_name}", table_schema, table_name))


def schema_changes(conn: psycopg.Connection, schema: str) -> dict[str, dict[str, object]]:
    """Each table's ("schema.table") last schema change, for the tables that had one; a blocked re-read
    (``reread_blocked``) only while no full backfill of the table registered after it has completed."""
    rows = conn.execute(sql.SQL(
        "SELECT r.table_schema || '.' || r.table_name, CASE WHEN EXISTS (SELECT 1 FROM {s}.backfills b "
        "WHERE r.last_schema_change ? 'reread_blocked' AND b.table_schema = r.table_schema "
        "AND b.table_name = r.table_name AND b.status = 'completed' AND b.start_value IS NULL "
        "AND b.end_value IS NULL AND b.created_at > (r.last_schema_change #>> '{{reread_blocked,since}}')::timestamptz) "
        "THEN r.last_schema_change - 'reread_blocked' ELSE r.last_schema_change END "
        "FROM {s}.relations r WHERE r.last_schema_change IS NOT NULL").format(s=sql.Identifier(schema))).fetchall()
    return {r[0]: r[1] for r in rows}


def name_of_relation(conn: psycopg.Connection, schema: str, relation_id: int) -> str | None:
    """The table ("schema.table") recorded with this relation id, if one is."""
    row = conn.execute(sql.SQL("SELECT table_schema || '.' || table_name FROM {}.relations WHERE relation_id = %s "
                               "ORDER BY updated_at LIMIT 1").format(sql.Identifier(schema)), (relation_id,)).fetchone()
    return str(row[0]) if row else None
