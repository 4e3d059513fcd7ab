"""A mirror table follows the source's schema changes, each at its position in the stream (a `schema` message
of the change log: capture/schema_changes.py), inside the transaction that applies the messages around it.

Each operation is applied so that it holds whatever the table already has: the mirror may hold a column
early (created from the source's latest description, which can be ahead of the mirror's position), so an
add of an existing column sets what existing rows hold, a rename onto an existing column moves the values
over, a drop of a missing column does nothing. Types are the mirror's (postgres/pgtypeinfo.py), changed
with the cast PostgreSQL's own ALTER TYPE uses; values are never truncated to an old type because the
column changes before the first value of the new type is written. An operation the mirror cannot apply is
an error naming the table, the column, the old and the new definition and the fix: the message is parked.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from cdc_pipeline.postgres.pgtypeinfo import TYPE_SQL


class SchemaFollowError(ValueError):
    """A schema change the mirror could not follow (the message is parked with this error)."""


def columns(conn: psycopg.Connection, target: tuple[str, str], generated: bool = False) -> dict[str, str]:
    """The mirror table's columns -> their types (format_type), in order: the ones messages are written to,
    or with ``generated`` also the ones it computes (a source's generated column the stream leaves out)."""
    return {str(r[0]): str(r[1]) for r in conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
        "to_regclass(format('%%I.%%I', %s::text, %s::text)) AND attnum > 0 AND NOT attisdropped "
        "AND (%s OR attgenerated = '') ORDER BY attnum", (*target, generated)).fetchall()}


def add_generated(conn: psycopg.Connection, target: tuple[str, str], name: str, type_sql: str, expression: str) -> None:
    """A source's generated column the stream does not carry, computed by the mirror as the source computes
    it. The expression is pg_get_expr's output from the source's catalog: one expression, parenthesized."""
    conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {} GENERATED ALWAYS AS ({}) STORED").format(
        sql.Identifier(*target), sql.Identifier(name), _type(type_sql), sql.SQL(expression)))  # no parameters: % as it is


def nothing_to_alter(conn: psycopg.Connection, target: tuple[str, str], source_table: str) -> bool:
    """The staged batch holds only schema changes of ``source_table`` and its mirror table does not exist."""
    schema, _, name = source_table.partition(".")
    row = conn.execute(
        "SELECT bool_and(msg->>'action' = 'schema') FROM _cdc_stage WHERE msg->'metadata'->>'table_schema' = %s "
        "AND msg->'metadata'->>'table_name' = %s", (schema, name)).fetchone()
    return bool(row and row[0]) and not columns(conn, target)


def apply(conn: psycopg.Connection, target: tuple[str, str], source_table: str, change: dict[str, Any],
          key: tuple[str, ...]) -> None:
    """Apply one `schema` message's operations (its ``record``) to the mirror table ``target``."""
    for op in change.get("ops") or []:
        kind = op.get("op")
        if kind not in ("add", "drop", "rename", "type"):
            continue  # recorded in the history only (defaults, NOT NULL, partitions, a table rename)
        try:
            with conn.transaction():  # a savepoint: the error below names the operation, not the batch
                _apply_op(conn, target, op, key)
        except psycopg.Error as exc:
            raise SchemaFollowError(_refusal(target, source_table, op, exc)) from exc


def _type(text: object) -> sql.Composable:
    # The drain's mirror types are format_type output of the source's catalog; nothing else is accepted.
    if not isinstance(text, str) or not TYPE_SQL.fullmatch(text):
        raise SchemaFollowError(f"unexpected column type {str(text)[:80]!r}")
    return sql.SQL(text)


def _apply_op(conn: psycopg.Connection, target: tuple[str, str], op: dict[str, Any], key: tuple[str, ...]) -> None:
    t = sql.Identifier(*target)
    have = columns(conn, target, generated=True)
    computed = set(have) - set(columns(conn, target))
    col = str(op.get("column") or "")
    c = sql.Identifier(col)
    if op["op"] == "drop":
        if col in have and col not in key:
            conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(t, c))
    elif op["op"] == "rename":
        new = str(op["new_name"])
        if col not in have:
            return
        if new in have:  # created early from a later description: the values move over
            conn.execute(sql.SQL("UPDATE {} SET {} = {}").format(t, sql.Identifier(new), c))
            conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(t, c))
        else:
            conn.execute(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(t, c, sql.Identifier(new)))
    elif op["op"] == "type":
        if col not in have:
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(t, c, _type(op["type"])))
        elif col in computed and have[col] != op["type"]:  # recomputed by its expression, as the source's
            conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(t, c, _type(op["type"])))
        elif have[col] != op["type"]:
            conn.execute(sql.SQL("ALTER TABLE {t} ALTER COLUMN {c} TYPE {ty} USING {c}::{ty}").format(
                t=t, c=c, ty=_type(op["type"])))
    elif op["op"] == "add" and op.get("generated"):
        if col not in have:
            add_generated(conn, target, col, str(op["type"]), str(op["generated"]))
    elif op["op"] == "add":
        _add(conn, t, have, col, op)


def _add(conn: psycopg.Connection, t: sql.Identifier, have: dict[str, str], col: str, op: dict[str, Any]) -> None:
    """Rows that existed before the ADD hold what the source's hold (its missing value, from the default)."""
    c, ty, missing = sql.Identifier(col), _type(op["type"]), op.get("missing")
    if col not in have:
        if missing is None:
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(t, c, ty))
        else:  # as the source does it: no rewrite, and the default dropped again (the mirror sets every value)
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {} DEFAULT {}::{}").format(
                t, c, ty, sql.Literal(str(missing)), ty))
            conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(t, c))
        return
    if have[col] != op["type"]:
        conn.execute(sql.SQL("ALTER TABLE {t} ALTER COLUMN {c} TYPE {ty} USING {c}::{ty}").format(t=t, c=c, ty=ty))
    if missing is not None:  # else NULL already: no record before the ADD carried the column
        conn.execute(sql.SQL("UPDATE {} SET {} = {}::{}").format(t, c, sql.Literal(str(missing)), ty))


def _refusal(target: tuple[str, str], source_table: str, op: dict[str, Any], exc: psycopg.Error) -> str:
    col = op.get("column")
    before = f" (was {op['old_type']})" if op.get("old_type") else ""
    what = {"add": f"ADD COLUMN {col} {op.get('type')}", "drop": f"DROP COLUMN {col}",
            "rename": f"RENAME COLUMN {col} TO {op.get('new_name')}",
            "type": f"ALTER COLUMN {col} TYPE {op.get('type')}{before}"}[op["op"]]
    reason = " ".join(str(exc).split())[:300]
    return (f"mirror {'.'.join(target)} of {source_table}: cannot follow the source's schema change, column "
            f"{col!r}: {what}: {type(exc).__name__}: {reason}. Fix: alter the mirror table by hand to match the "
            f"source (or drop it and backfill {source_table}), then `cdc-pipeline failed retry --all`")
