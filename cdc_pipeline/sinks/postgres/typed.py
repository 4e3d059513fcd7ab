"""The mirror's typed reads: backfill rows that arrive as composite text (sinks/base.py TypedRow), applied
without JSON.

They are COPYed into their own stage table beside the JSON messages' (same ``seq`` numbering), parsed by
PostgreSQL's composite input into a temp table type of their shape, and applied with one INSERT (into an
empty key range: ``PlainInserts``) or MERGE per run:
a table's messages of a batch segment are cut into maximal runs of typed reads of one shape and of
other messages, applied in ``seq`` order, so per-key order holds across the two paths. A read is a row's
full state, so within a run the last read of each key is the one applied. Columns the row does not hold
(added to the table after it was read) keep their value, as for an unchanged TOAST value. A run of the log
made only of typed reads is relayed from the state database's COPY (state/typed_log.py) without a Python
object per row: one table's reads of one shape into an empty key range of a mirror table that has their
columns with their types are COPYed straight into it as CSV (``copy_run``: a composite text is a CSV line
once its parentheses are gone), else into ``_cdc_typed`` (``stage_copy``) and applied as above.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence

import psycopg
from psycopg import sql

from cdc_pipeline.postgres.catalog import TableInfo
from cdc_pipeline.postgres.compose import execute
from cdc_pipeline.postgres.pgtypeinfo import TYPE_SQL
from cdc_pipeline.sinks.base import TypedRow

Columns = tuple[tuple[str, str], ...]
JSON_RUN = -1  # the shape number of a run of messages that are not typed reads

STAGE_DDL = ("CREATE TEMP TABLE IF NOT EXISTS _cdc_typed (seq integer, sch text, tbl text, shape integer, tup text) "
             "ON COMMIT DELETE ROWS")


class TypedMismatch(ValueError):
    """These typed reads do not fit the mirror table any more (its key was renamed since they were read):
    a failure of those messages, never of the sink."""


def stage(conn: psycopg.Connection, rows: Sequence[tuple[int, TypedRow]]) -> list[Columns]:
    """COPY the typed reads of a batch into ``_cdc_typed``; their shapes, by shape number."""
    shapes: dict[Columns, int] = {}
    seen: dict[int, int] = {}  # by id: a backfill's rows share one columns tuple, not worth hashing per row
    with conn.cursor().copy("COPY _cdc_typed (seq, sch, tbl, shape, tup) FROM STDIN") as copy:
        for seq, row in rows:
            number = seen.get(id(row.columns))
            if number is None:
                number = seen[id(row.columns)] = shapes.setdefault(row.columns, len(shapes))
            copy.write_row((seq, row.table_schema, row.table_name, number, row.text))
    return list(shapes)


def stage_copy(conn: psycopg.Connection, blocks: Iterable[bytes]) -> int:
    """COPY a relayed run of typed reads (COPY text rows ``seq, sch, tbl, shape, tup``, state/typed_log.py) into
    ``_cdc_typed`` as it comes, a block at a time; how many rows it held."""
    rows = 0
    with conn.cursor().copy("COPY _cdc_typed (seq, sch, tbl, shape, tup) FROM STDIN") as copy:
        for block in blocks:
            rows += block.count(b"\n")  # one line per row: COPY text escapes newlines inside values
            copy.write(block)
    return rows


def tables(conn: psycopg.Connection) -> list[str]:
    return [f"{r[0]}.{r[1]}" for r in conn.execute("SELECT DISTINCT sch, tbl FROM _cdc_typed").fetchall()]


def runs(conn: psycopg.Connection, schema: str, name: str, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(first seq, last seq, shape number or JSON_RUN) of each run of one table's messages in [lo, hi)."""
    rows = conn.execute(
        "SELECT min(seq), max(seq), shape FROM ("
        "  SELECT seq, shape, row_number() OVER (ORDER BY seq) - row_number() OVER (PARTITION BY shape ORDER BY seq)"
        "    AS run FROM ("
        "    SELECT seq, -1 AS shape FROM _cdc_stage WHERE msg->'metadata'->>'table_schema' = %(schema)s"
        "      AND msg->'metadata'->>'table_name' = %(name)s AND seq >= %(lo)s AND seq < %(hi)s"
        "    UNION ALL"
        "    SELECT seq, shape FROM _cdc_typed WHERE sch = %(schema)s AND tbl = %(name)s"
        "      AND seq >= %(lo)s AND seq < %(hi)s) u) r "
        "GROUP BY shape, run ORDER BY 1", {"schema": schema, "name": name, "lo": lo, "hi": hi}).fetchall()
    return [(int(a), int(b), int(c)) for a, b, c in rows]


def _row_type(conn: psycopg.Connection, columns: Columns) -> sql.Composable:
    """A temp table whose row type parses composite text of ``columns`` (names and types from the source
    catalog: identifiers quoted, type names from format_type)."""
    for _, type_sql in columns:  # built-in type names only (backfill/typed.py); never anything to execute
        if not TYPE_SQL.fullmatch(type_sql):
            raise ValueError(f"typed row: unexpected column type {type_sql[:80]!r}")
    name = "_cdc_row_" + hashlib.sha256(json.dumps(columns).encode()).hexdigest()[:20]
    ident = sql.Identifier("pg_temp", name)
    conn.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ({})").format(
        sql.Identifier(name),
        sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns)))
    return ident


def written_columns(info: TableInfo, columns: Columns, schema: str, name: str) -> list[str]:
    """The run's columns the mirror table has (the others are left out); TypedMismatch if its key is not among them."""
    have = {c.name for c in info.columns}
    names = [c for c, _ in columns if c in have]
    if not set(info.primary_key) <= set(names):
        raise TypedMismatch(f"typed reads of {schema}.{name} do not hold its key {list(info.primary_key)} (renamed "
                            "since they were read?): backfill the table again, then discard these")
    return names


def copyable(info: TableInfo, columns: Columns, schema: str, name: str) -> bool:
    """Whether the mirror table has every column of the reads with the read's own type (format_type): then a
    COPY of the composite text parses each value as the cast to the row type does, and assigns it unchanged.
    A column it lacks, or of another type, leaves the run to ``apply_run``."""
    written_columns(info, columns, schema, name)
    types = {c.name: c.type_sql for c in info.columns}
    return all(types.get(c) == t for c, t in columns)


_COPY_ESCAPE = re.compile(rb"\\(.)", re.DOTALL)
_COPY_UNESCAPED = {b"\\": b"\\", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f", b"v": b"\v"}


def composite_csv(block: bytes) -> bytes:
    """COPY text lines each holding a composite text (``(1,"a b",)``, record_out's) -> CSV lines of its fields
    (``1,"a b",``). record_out already writes CSV but for the parentheses and for doubling backslashes: it
    quotes a value that holds a quote, backslash, comma, parenthesis or space (so no line is ``\\.``), doubles
    quotes and backslashes in it, and writes NULL as nothing (CSV's NULL) and '' as ``""``. COPY text escapes
    (a newline inside a value is ``\\n``, so a raw one ends a row) are undone after the rows are cut."""
    if not block:
        return block
    body = block[1:-2].replace(b")\n(", b"\n") + b"\n"
    if b"\\" in body:
        body = _COPY_ESCAPE.sub(lambda m: _COPY_UNESCAPED.get(m.group(1), m.group(0)), body).replace(b"\\\\", b"\\")
    return body


def copy_run(conn: psycopg.Connection, target: tuple[str, str], columns: Columns, blocks: Iterable[bytes]) -> int | None:
    """COPY a run's composite texts (``RunRows.composite``, state/typed_log.py) into the mirror table, under a
    savepoint: how many rows, or None when one of its keys was there already or twice in the run (a unique
    violation: nothing written). The caller checks ``copyable`` and the unique index on the key first."""
    query = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        sql.Identifier(*target), sql.SQL(", ").join(sql.Identifier(c) for c, _ in columns))
    rows = 0
    try:
        with conn.transaction(), conn.cursor().copy(query) as copy:
            for block in blocks:
                rows += block.count(b"\n")  # one line per row in COPY text
                copy.write(composite_csv(block))
    except psycopg.errors.UniqueViolation:
        return None
    return rows


class PlainInserts:
    """Which mirror tables a run of typed reads is written to by plain INSERT instead of MERGE (a MERGE joins
    every read to the table: about 1.4x the work of inserting). The INSERT runs under a savepoint, so it is
    all or nothing: it succeeds only when the mirror holds no key of the run (an empty key range, as in a
    first backfill), where it does exactly what the MERGE would; on a unique violation (a key is there, or a
    concurrent transaction is inserting it) it is rolled back and the MERGE applies the run. After such a
    fallback a table is merged for ``BACKOFF_RUNS`` runs before the INSERT is tried again, so a backfill
    into a full mirror wastes at most one failed INSERT (it fails at its first key) in so many runs."""

    BACKOFF_RUNS = 4

    def __init__(self) -> None:
        self._merge_for: dict[tuple[str, str], int] = {}

    def wanted(self, target: tuple[str, str]) -> bool:
        left = self._merge_for.get(target, 0)
        if left:
            self._merge_for[target] = left - 1
        return not left

    def fell_back(self, target: tuple[str, str]) -> None:
        self._merge_for[target] = self.BACKOFF_RUNS


def unique_on_key(conn: psycopg.Connection, target: tuple[str, str], pk: Sequence[str]) -> bool:
    """Whether the mirror table has a unique index on columns of its key (its primary key, as the sink creates
    it): without one a plain INSERT could add a second row for a key."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(%s) AND i.indisunique "
        "AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL AND 0 <> ALL (i.indkey) AND ARRAY("
        "  SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)"
        ") <@ %s::text[])", (sql.Identifier(*target).as_string(conn), list(pk))).fetchone()
    return bool(row and row[0])


def apply_run(conn: psycopg.Connection, target: tuple[str, str], info: TableInfo, schema: str, name: str,
              columns: Columns, shape: int, lo: int, hi: int, plain: PlainInserts | None = None) -> None:
    """Upsert the last typed read of each key among one table's reads of one shape with seq in [lo, hi]: by
    plain INSERT where the mirror holds none of their keys (``PlainInserts``), else by MERGE."""
    pk = info.primary_key
    names = written_columns(info, columns, schema, name)
    row_type = _row_type(conn, columns)
    key = sql.SQL(", ").join(sql.SQL("(q.v).{}").format(sql.Identifier(k)) for k in pk)
    # OFFSET 0 keeps the cast in the subquery: one parse per row, not one per column of (q.v).*.
    reads = sql.SQL(
        "SELECT DISTINCT ON ({key}) (q.v).* FROM ("
        "  SELECT s.seq, s.tup::{row_type} AS v FROM _cdc_typed s"
        "  WHERE s.sch = %s AND s.tbl = %s AND s.shape = %s AND s.seq >= %s AND s.seq <= %s OFFSET 0) q"
        " ORDER BY {key}, q.seq DESC").format(key=key, row_type=row_type)
    params = (schema, name, shape, lo, hi)
    cols = sql.SQL(", ").join(map(sql.Identifier, names))
    values = sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(c)) for c in names)
    if plain is not None and plain.wanted(target) and unique_on_key(conn, target, pk):
        try:
            with conn.transaction():  # a savepoint: the INSERT is all or nothing
                execute(conn, sql.SQL("INSERT INTO {t} ({cols}) SELECT {values} FROM ({reads}) s").format(
                    t=sql.Identifier(*target), cols=cols, values=values, reads=reads), params)
            return
        except psycopg.errors.UniqueViolation:
            plain.fell_back(target)
    on = sql.SQL(" AND ").join(sql.SQL("t.{k} = s.{k}").format(k=sql.Identifier(k)) for k in pk)
    rest = [c for c in names if c not in pk]
    update = sql.SQL("WHEN MATCHED THEN UPDATE SET {} ").format(sql.SQL(", ").join(
        sql.SQL("{c} = s.{c}").format(c=sql.Identifier(c)) for c in rest)) if rest else sql.SQL("")
    execute(conn, sql.SQL(
        "MERGE INTO {t} t USING ({reads}) s ON {on} {update}WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({values})"
    ).format(t=sql.Identifier(*target), reads=reads, on=on, update=update, cols=cols, values=values), params)


def apply_one_shape(conn: psycopg.Connection, count: int, tables: Sequence[tuple[str, str]], columns: Columns,
                    sync: Callable[[str], tuple[tuple[str, str], TableInfo]], plain: PlainInserts | None = None) -> None:
    """``count`` staged typed reads of ``tables``, all of one shape: each table's reads are one run, the whole
    batch (no truncate, no JSON message between them), so ``runs`` need not look for them. ``sync`` gives a
    source table's mirror table (created or altered as needed) and its description."""
    for schema, name in tables:
        target, info = sync(f"{schema}.{name}")
        apply_run(conn, target, info, schema, name, columns, 0, 0, count - 1, plain)
