"""Catalog queries against the source database (all identifiers passed as values or sql.Identifier)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

# Storage other than 'p' (plain) means values can be TOASTed out of line.
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid, a.attstorage <> 'p',
       coalesce(a.attnum = ANY (i.indkey), false)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_PK_ORDER = """
SELECT a.attname
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE n.nspname = %s AND c.relname = %s AND i.indisprimary
ORDER BY k.ord
"""


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    type_sql: str
    type_oid: int
    toastable: bool
    in_primary_key: bool


@dataclass(frozen=True, slots=True)
class TableInfo:
    schema: str
    name: str
    columns: tuple[ColumnInfo, ...]
    primary_key: tuple[str, ...]
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


def describe_table(conn: psycopg.Connection, schema: str, name: str) -> TableInfo | None:
    row = conn.execute(
        "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (schema, name),
    ).fetchone()
    if row is None:
        return None
    columns = tuple(ColumnInfo(*r) for r in conn.execute(_COLUMNS, (schema, name)).fetchall())
    pk = tuple(r[0] for r in conn.execute(_PK_ORDER, (schema, name)).fetchall())
    return TableInfo(schema, name, columns, pk, str(row[0]))


def setting(conn: psycopg.Connection, name: str) -> str:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else ""


def can_replicate(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


def slot_info(conn: psycopg.Connection, slot: str) -> dict[str, object] | None:
    row = conn.execute(
        "SELECT plugin, active, confirmed_flush_lsn::text, restart_lsn::text, "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    keys = ("plugin", "active", "confirmed_flush_lsn", "restart_lsn", "lag_bytes", "retained_bytes")
    return dict(zip(keys, row, strict=True))


def publication_tables(conn: psycopg.Connection, publication: str) -> set[str] | None:
    """The tables in a publication as 'schema.table', or None when it does not exist."""
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is None:
        return None
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,)
    ).fetchall()
    return {f"{r[0]}.{r[1]}" for r in rows}
