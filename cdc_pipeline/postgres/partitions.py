"""Partitioned tables in the source catalog: which relations are partitions of which, and how a publication
publishes them (by their root, or by each leaf)."""

from __future__ import annotations

import psycopg

# A relation's ancestors, nearest first (pg_partition_ancestors lists the relation itself first).
_ANCESTORS = """
SELECT n.nspname, c.relname
FROM pg_partition_ancestors(%s::oid) WITH ORDINALITY AS a(relid, ord)
JOIN pg_class c ON c.oid = a.relid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE a.relid <> %s::oid
ORDER BY a.ord
"""


def ancestors(conn: psycopg.Connection, relation_id: int) -> list[str]:
    """The partitioned tables ``relation_id`` is a partition of ('schema.table', nearest first); empty for a
    table that is no partition, or a relation the catalog no longer holds."""
    try:
        return [f"{s}.{t}" for s, t in conn.execute(_ANCESTORS, (relation_id, relation_id)).fetchall()]
    except psycopg.errors.UndefinedObject:  # pragma: no cover - dropped between the stream and this query
        return []


def table_ancestors(conn: psycopg.Connection, schema: str, name: str) -> list[str]:
    """``ancestors`` of a table named by schema and name."""
    row = conn.execute("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text))::oid", (schema, name)).fetchone()
    return ancestors(conn, int(row[0])) if row and row[0] is not None else []


def is_partitioned(conn: psycopg.Connection, schema: str, name: str) -> bool:
    row = conn.execute("SELECT c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
    return bool(row and row[0])


def leaves(conn: psycopg.Connection, schema: str, name: str) -> list[str]:
    """Every leaf partition of a partitioned table, at any depth ('schema.table')."""
    return [str(r[0]) for r in conn.execute(
        "SELECT format('%%s.%%s', n.nspname, c.relname) FROM pg_partition_tree(to_regclass(format('%%I.%%I', "
        "%s::text, %s::text))) t JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE t.isleaf ORDER BY 1", (schema, name)).fetchall()]


def via_root(conn: psycopg.Connection, publication: str) -> bool | None:
    """Whether a publication publishes partitions' changes as their root's (None: no such publication)."""
    row = conn.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    return None if row is None else bool(row[0])
