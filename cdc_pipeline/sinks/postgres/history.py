"""What a mirror table is made of, from the change log's schema history: the columns it is created with (the
source's as of the messages being applied, which a lagging mirror must not take from the source's latest
description), and its own description once it exists (the columns messages are written to)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import psycopg
from psycopg import sql

from cdc_pipeline.postgres.catalog import ColumnInfo, TableInfo


def columns_before_next_change(conn: psycopg.Connection, schema: str, table: str,
                               position: tuple[int, int]) -> list[dict[str, object]] | None:
    """The columns (name, mirror type) ``table`` had before its first schema change after ``position``, or
    None when the log holds none (the latest description is then the one in force)."""
    table_schema, _, name = table.partition(".")
    row = conn.execute(sql.SQL(
        "SELECT changes -> 'columns' FROM {}.change_log WHERE action = 'schema' AND table_schema = %s "
        "AND table_name = %s AND (commit_lsn, commit_idx) > (%s, %s) ORDER BY commit_lsn, commit_idx LIMIT 1"
    ).format(sql.Identifier(schema)), (table_schema, name, *position)).fetchone()
    return list(row[0]) if row and row[0] else None


def creation_columns(latest: TableInfo, before: Sequence[Mapping[str, object]] | None) -> list[ColumnInfo]:
    """The columns to create a mirror table with: the ones before the next schema change when there is one
    (and it holds the key), else the latest description's."""
    if not before or any(not isinstance(c.get("type"), str) for c in before):
        return list(latest.columns)
    names = [str(c["name"]) for c in before]
    if not set(latest.primary_key) <= set(names):
        return list(latest.columns)
    return [ColumnInfo(str(c["name"]), str(c["type"]), 0, False, str(c["name"]) in latest.primary_key,
                       str(c["type"])) for c in before]


def mirror_info(source: TableInfo, columns: Mapping[str, str]) -> TableInfo:
    """The mirror table described with its own columns and types (name -> format_type) and the source's key."""
    return TableInfo(source.schema, source.name, tuple(
        ColumnInfo(name, type_sql, 0, False, name in source.primary_key, type_sql) for name, type_sql in columns.items()
    ), source.primary_key, source.replica_identity, source.identity_columns)
