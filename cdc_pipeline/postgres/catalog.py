"""Catalog queries, all of them (identifiers passed as values or sql.Identifier): tables, columns, types,
slots and publications of the source database, and whether a table exists in any database."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_pipeline.postgres.oids import FIRST_USER_OID
from cdc_pipeline.postgres.pgtypeinfo import PgType, unknown

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

# The columns of a table's primary key or REPLICA IDENTITY USING INDEX index, in index order.
_INDEX_COLUMNS = """
SELECT a.attname
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE n.nspname = %s AND c.relname = %s AND i.{flag}
ORDER BY k.ord
"""
_PK_ORDER = _INDEX_COLUMNS.format(flag="indisprimary")
_IDENTITY_INDEX = _INDEX_COLUMNS.format(flag="indisreplident")


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    type_sql: str
    type_oid: int
    toastable: bool
    in_primary_key: bool
    mirror_type: str | None = None  # the type a Postgres mirror gives it (pgtypeinfo.mirror_plan), when recorded


@dataclass(frozen=True, slots=True)
class TableInfo:
    schema: str
    name: str
    columns: tuple[ColumnInfo, ...]
    primary_key: tuple[str, ...]
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)
    # The columns a DELETE's old tuple carries (and an UPDATE's, when they change): the primary key
    # under DEFAULT, every column under FULL, the index's columns under USING INDEX, none under NOTHING.
    identity_columns: tuple[str, ...] = ()
    # Generated columns the stream leaves out (a mirror computes them with the source's expression).
    generated: tuple[GeneratedColumn, ...] = ()

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
    identity = str(row[0])
    if identity == "d":
        key = pk
    elif identity == "f":
        key = tuple(c.name for c in columns)
    elif identity == "i":
        key = tuple(r[0] for r in conn.execute(_IDENTITY_INDEX, (schema, name)).fetchall())
    else:
        key = ()
    return TableInfo(schema, name, columns, pk, identity, key)


def setting(conn: psycopg.Connection, name: str) -> str:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else ""


def can_replicate(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


# The server's WAL position: written (a primary) or replayed (a standby, where a slot may live on 16+).
WAL_POSITION = "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"


def slot_info(conn: psycopg.Connection, slot: str) -> dict[str, object] | None:
    row = conn.execute(
        "SELECT plugin, active, confirmed_flush_lsn::text, restart_lsn::text, "
        f"pg_wal_lsn_diff({WAL_POSITION}, confirmed_flush_lsn)::bigint, "
        f"pg_wal_lsn_diff({WAL_POSITION}, restart_lsn)::bigint, database, wal_status "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    keys = ("plugin", "active", "confirmed_flush_lsn", "restart_lsn", "lag_bytes", "retained_bytes", "database",
            "wal_status")
    return dict(zip(keys, row, strict=True))


def slot_position(conn: psycopg.Connection, slot: str) -> tuple[int, str | None] | None:
    """A slot's confirmed flush LSN (0 before it confirmed any) and WAL status; None if there is no such slot."""
    row = conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint, wal_status FROM pg_replication_slots "
                       "WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else (int(row[0] or 0), row[1])


def publication_exists(conn: psycopg.Connection, publication: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is not None


def publication_tables(conn: psycopg.Connection, publication: str) -> set[str] | None:
    """The tables in a publication as 'schema.table', or None when it does not exist."""
    if not publication_exists(conn, publication):
        return None
    # pg_publication_tables lists a partitioned table's leaves unless publish_via_partition_root: the tables
    # added by name (pg_publication_rel) count as published too.
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s UNION "
        "SELECT n.nspname, c.relname FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
        "JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
        (publication, publication)).fetchall()
    return {f"{r[0]}.{r[1]}" for r in rows}


def privileges(conn: psycopg.Connection, schema: str, name: str) -> dict[str, bool]:
    """What the current user may do with a table: read it (backfills) and own it (add it to a publication)."""
    row = conn.execute(
        "SELECT has_table_privilege(c.oid, 'SELECT'), pg_has_role(c.relowner, 'USAGE') FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, name)).fetchone()
    return {"select": bool(row and row[0]), "owner": bool(row and row[1])}


def can_create_in_database(conn: psycopg.Connection) -> bool:
    """CREATE on the current database: needed for CREATE PUBLICATION and for a new schema."""
    row = conn.execute("SELECT has_database_privilege(current_database(), 'CREATE')").fetchone()
    return bool(row and row[0])


def publication_actions(conn: psycopg.Connection, publication: str) -> dict[str, bool]:
    """Which actions a publication publishes (all four unless it was created with `publish = ...`)."""
    row = conn.execute("SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s",
                       (publication,)).fetchone()
    return dict(zip(("insert", "update", "delete", "truncate"), row or (True,) * 4, strict=True))


# One pg_type row per type: what it is and what it refers to (a domain's base, an array's element, a
# composite's attributes), so load_types can follow the references level by level.
_TYPES = """
SELECT t.oid, format_type(t.oid, NULL), t.typtype,
       CASE WHEN t.typsubscript = 'array_subscript_handler'::regproc THEN t.typelem END,
       nullif(t.typbasetype, 0), t.typtypmod,
       CASE WHEN t.typbasetype <> 0 THEN format_type(t.typbasetype, t.typtypmod) END,
       (SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum), '{}') FROM pg_attribute a
         WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
       (SELECT coalesce(array_agg(a.atttypid::bigint ORDER BY a.attnum), '{}') FROM pg_attribute a
         WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
       t.typdelim
FROM pg_type t WHERE t.oid = ANY(%s::oid[])
"""


def load_types(conn: psycopg.Connection, oids: Iterable[int]) -> dict[int, PgType]:
    """The types ``oids`` with everything they refer to, as PgType trees (a type the catalog no longer
    holds comes back as ``pgtypeinfo.unknown``: rendered as its text)."""
    rows: dict[int, tuple[Any, ...]] = {}
    wanted = {int(o) for o in oids}
    while wanted:
        found = conn.execute(_TYPES, (sorted(wanted),)).fetchall()
        for row in found:
            rows[int(row[0])] = row
        wanted = {int(o) for row in found for o in (row[3], row[4], *row[8]) if o is not None} - set(rows)
        wanted -= {o for o in wanted if o in rows}
    built: dict[int, PgType] = {}

    def build(oid: int, depth: int = 0) -> PgType:
        if oid in built:
            return built[oid]
        row = rows.get(oid)
        if row is None or depth > 50:  # dropped since, or a pathological chain
            return unknown(oid)
        _, sql, kind, element, base, typmod, base_sql, names, attr_oids, delimiter = row
        t = PgType(oid, str(sql), str(kind),
                   element=build(int(element), depth + 1) if element is not None else None,
                   base=build(int(base), depth + 1) if base is not None else None,
                   base_typmod=int(typmod), base_sql=str(base_sql or ""),
                   attributes=tuple((str(n), build(int(a), depth + 1)) for n, a in zip(names, attr_oids, strict=True)),
                   delimiter=str(delimiter))
        built[oid] = t
        return t

    return {o: build(o) for o in {int(x) for x in oids}}


# Columns whose values a pipeline cannot carry exactly everywhere: money prints by lc_monetary (a mirror
# with another lc_monetary reads the text differently); a type with a cast to jsonb (an extension's, such
# as hstore) is rendered by to_jsonb through the cast, while records carry its text.
_INEXACT = """
SELECT a.attname,
       CASE WHEN a.atttypid IN ('money'::regtype, 'money[]'::regtype) THEN 'money'
            ELSE 'jsonb cast' END
FROM pg_attribute a
WHERE a.attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) AND a.attnum > 0 AND NOT a.attisdropped
  AND (a.atttypid IN ('money'::regtype, 'money[]'::regtype)
       OR EXISTS (SELECT 1 FROM pg_cast c WHERE c.castsource = a.atttypid AND c.casttarget = 'jsonb'::regtype
                  AND a.atttypid >= %s))
ORDER BY a.attnum
"""


# Each column: name, type as SQL, and what its type (or an array's element type) is: its kind
# (pg_type.typtype) and OID.
_COLUMN_KINDS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid,
       coalesce(e.typtype, t.typtype), coalesce(e.oid, t.oid), t.typelem <> 0 AND t.typlen = -1
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typlen = -1 AND t.typelem <> 0
WHERE a.attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


@dataclass(frozen=True, slots=True)
class ColumnKind:
    name: str
    type_sql: str
    type_oid: int
    kind: str  # pg_type.typtype of the type, or of an array's element type: b(ase), e(num), d(omain), ...
    base_oid: int  # the type's OID, or an array's element type's
    is_array: bool


def column_kinds(conn: psycopg.Connection, schema: str, name: str) -> list[ColumnKind]:
    """The table's columns in order, with what their types are (see _COLUMN_KINDS)."""
    return [ColumnKind(str(n), str(t), int(o), str(k), int(b), bool(a))
            for n, t, o, k, b, a in conn.execute(_COLUMN_KINDS, (schema, name)).fetchall()]


def inexact_columns(conn: psycopg.Connection, schema: str, name: str) -> dict[str, str]:
    """Columns (name -> 'money' or 'jsonb cast') whose values are exact only under conditions (see _INEXACT)."""
    return {str(r[0]): str(r[1]) for r in conn.execute(_INEXACT, (schema, name, FIRST_USER_OID)).fetchall()}


def table_exists(conn: psycopg.Connection, schema: str, name: str) -> bool:
    """Whether ``schema.name`` names a table (or another relation) in this database."""
    row = conn.execute("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text))", (schema, name)).fetchone()
    return row is not None and row[0] is not None


def table_oid(conn: psycopg.Connection, schema: str, name: str) -> int | None:
    row = conn.execute("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text))::oid", (schema, name)).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def estimated_rows(conn: psycopg.Connection, schema: str, name: str) -> int | None:
    """The planner's estimate of a table's rows (0 before it was first analyzed); None if it does not exist."""
    row = conn.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = "
                       "to_regclass(format('%%I.%%I', %s::text, %s::text))", (schema, name)).fetchone()
    return int(row[0]) if row else None


def total_size(conn: psycopg.Connection, schema: str, name: str) -> int | None:
    """A table's bytes on disk, with its indexes and TOAST; None if it does not exist."""
    row = conn.execute("SELECT pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n "
                       "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
    return int(row[0]) if row else None


def column_flags(conn: psycopg.Connection, schema: str, name: str) -> dict[str, tuple[bool, bool]]:
    """Each column of a table -> (declared NOT NULL, generated)."""
    return {str(r[0]): (bool(r[1]), bool(r[2])) for r in conn.execute(
        "SELECT attname, attnotnull, attgenerated <> '' FROM pg_attribute "
        "WHERE attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) AND attnum > 0 AND NOT attisdropped",
        (schema, name)).fetchall()}


@dataclass(frozen=True, slots=True)
class GeneratedColumn:
    name: str
    type_sql: str
    expression: str  # pg_get_expr of its generation expression
    stored: bool  # attgenerated 's' (PostgreSQL 18 also has virtual ones, 'v')


def generated_columns(conn: psycopg.Connection, schema: str, name: str) -> list[GeneratedColumn]:
    """The table's generated columns in order, with their generation expressions."""
    return [GeneratedColumn(str(n), str(t), str(e), g == "s") for n, t, e, g in conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), pg_get_expr(d.adbin, d.adrelid), a.attgenerated "
        "FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) AND a.attnum > 0 "
        "AND NOT a.attisdropped AND a.attgenerated <> '' ORDER BY a.attnum", (schema, name)).fetchall()]


def publishes_generated(conn: psycopg.Connection, publication: str) -> bool:
    """Whether the publication carries STORED generated columns' values (PostgreSQL 18+:
    publish_generated_columns = stored); before 18 pgoutput never sends them."""
    if conn.info.server_version < 180000:
        return False
    row = conn.execute("SELECT pubgencols = 's' FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    return bool(row and row[0])


def streamed_generated(conn: psycopg.Connection, publication: str, schema: str, name: str
                       ) -> tuple[set[str], list[GeneratedColumn]]:
    """The table's generated columns the stream carries (names), and those it leaves out: a record holds
    the former, and a Postgres mirror computes the latter with the source's expression."""
    gen = generated_columns(conn, schema, name)
    if not gen:
        return set(), []
    carried = publishes_generated(conn, publication)
    return {g.name for g in gen if carried and g.stored}, [g for g in gen if not (carried and g.stored)]


def column_types(conn: psycopg.Connection, schema: str, name: str) -> dict[str, str]:
    """Each column of a table -> its type as SQL (format_type); empty if the table does not exist."""
    return {str(r[0]): str(r[1]) for r in conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) AND attnum > 0 AND NOT attisdropped",
        (schema, name)).fetchall()}


def leads_an_index(conn: psycopg.Connection, schema: str, name: str, column: str) -> bool:
    """Whether a (not partial) index of the table starts with ``column``."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = i.indkey[0] WHERE i.indrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) "
        "AND a.attname = %s AND i.indpred IS NULL)", (schema, name, column)).fetchone()
    return bool(row and row[0])


def format_types(conn: psycopg.Connection, types: list[tuple[int, int]]) -> list[str]:
    """(type OID, type modifier) -> the type as SQL (format_type), in order."""
    if not types:
        return []
    rows = conn.execute("SELECT format_type(o, m) FROM unnest(%s::oid[], %s::int[]) WITH ORDINALITY "
                        "AS u(o, m, i) ORDER BY i", ([t[0] for t in types], [t[1] for t in types])).fetchall()
    return [str(r[0]) for r in rows]
