"""Reading a backfill's pages from the source and staging them in the state database.

One page: the low watermark (its own transaction), then in one REPEATABLE READ transaction the table
locked (before the snapshot: see ``PageReader._lock``), ``pg_current_snapshot()`` and the keyset select under ``SET LOCAL statement_timeout``, its rows staged
with the snapshot and the page's cursor; then the high watermark. When the state lives in the source
database, reading and staging are one ``INSERT ... SELECT`` (the rows never leave the server); otherwise
they are streamed binary ``COPY TO`` -> ``COPY FROM``, a block at a time, without being decoded (only the
page's last tuple is, for its cursor).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import psycopg
from psycopg import sql

from cdc_pipeline.backfill.copybinary import tuple_fields
from cdc_pipeline.backfill.request import TableShape
from cdc_pipeline.backfill.typed import typed_columns
from cdc_pipeline.backfill.watermark import WATERMARK_PREFIX, Watermark, page_token
from cdc_pipeline.postgres import catalog
from cdc_pipeline.postgres.compose import escape_percent
from cdc_pipeline.postgres.keyset import count_query, page_query
from cdc_pipeline.postgres.pgtypeinfo import TextRule
from cdc_pipeline.state.backfill_pages import PageStore
from cdc_pipeline.state.backfills import BackfillSpec
from cdc_pipeline.state.relations import column_record, generated_records, upsert_relation
from cdc_pipeline.state.typed_rows import Columns

COPY_BLOCK = 1 << 20
# A `json` value jsonb refuses is read as the drain logs it (capture/json_text.py: json_text): NUL escapes
# turned into escaped backslashes, or, when jsonb still refuses it, the JSON string of its exact text. Only
# values that may be refused (a \u escape, an exponent, a long text) go through the function, whose
# exception block costs a subtransaction.
_JSON_FUNCTION = sql.SQL(r"""
CREATE OR REPLACE FUNCTION pg_temp.cdc_pipeline_json(j json) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
    RETURN regexp_replace(j::text, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\\\u0000', 'g')::jsonb;
EXCEPTION WHEN others THEN
    RETURN to_jsonb(j::text);
END
$f$""")
_JSON_SUSPECT = sql.Literal(r"\\u|[0-9.][eE]")
_TEXT_RULE_SQL: dict[TextRule, str] = {
    TextRule.ALWAYS: "{c}::text",
    TextRule.JSON: r"regexp_replace({c}::text, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\\\u0000', 'g')",
    TextRule.JSON_NULL: "CASE WHEN {c}::text = 'null' THEN 'null' END",
    TextRule.NEGATIVE_ZERO: "CASE WHEN {c}::text = '-0' THEN '-0' END",
    TextRule.BOUNDS: "CASE WHEN left({c}::text, 1) = '[' THEN {c}::text END",
}


def _json_record(shape: TableShape, col: Callable[[str], sql.Composable]) -> sql.Composable:
    """The row's record as to_jsonb makes it, its `json` values read as the drain logs them."""
    def value(c: str) -> sql.Composable:
        if c not in shape.json_columns:
            return col(c)
        return sql.SQL("CASE WHEN {v}::text ~ {suspect} OR length({v}::text) > 16383 "
                       "THEN pg_temp.cdc_pipeline_json({v}) ELSE {v}::jsonb END").format(v=col(c), suspect=_JSON_SUSPECT)

    return sql.SQL("(SELECT to_jsonb(_cdc_row.*) FROM (SELECT {}) _cdc_row)").format(sql.SQL(", ").join(
        sql.SQL("{} AS {}").format(value(c), sql.Identifier(escape_percent(c))) for c in shape.columns))


def _texts(shape: TableShape, col: Callable[[str], sql.Composable]) -> sql.Composable:
    """The texts a mirror needs of the row's values (a JSON object, NULL when none), as the drain logs them
    (capture/changes.py)."""
    if not shape.text_rules:
        return sql.SQL("NULL::jsonb")
    pairs = [sql.SQL("{}, {}").format(sql.Literal(escape_percent(c)), sql.SQL(_TEXT_RULE_SQL[rule]).format(c=col(c)))
             for c, rule in shape.text_rules]
    # jsonb_build_object takes at most 100 arguments: 50 columns per call.
    objects = [sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(pairs[i:i + 50]))
               for i in range(0, len(pairs), 50)]
    return sql.SQL("nullif(jsonb_strip_nulls({}), '{{}}')").format(sql.SQL(" || ").join(objects))


def _render(conn: psycopg.Connection, query: sql.Composable, params: Sequence[object]) -> str:
    """The query with its %s placeholders replaced by literals (COPY takes no parameters). Values go
    in as untyped literals, so PostgreSQL reads each with the type of the column it meets."""
    return query.as_string(conn) % tuple(sql.Literal(p).as_string(conn) for p in params)


def page_sql(conn: psycopg.Connection, shape: TableShape, backfill_id: str, page_no: int,
             cursor: Sequence[str] | None, start: str | None, end: str | None, limit: int,
             typed: Columns | None = None) -> str:
    """SELECT (backfill_id, page_no, seq, pk, record, tup, cursor) for one page; cursor is set on its last
    row only.

    ``pk`` is the JSON array text of the key as the drain writes it (``[1, "a"]``); ``record`` is
    ``to_jsonb`` of the row, as the drain's records are, and ``texts`` what a mirror needs besides; or, with
    ``typed`` (the columns of a typed read, backfill/typed.py), ``record`` is NULL and ``tup`` the row's
    composite text.
    """
    inner, inner_params = page_query(shape.schema, shape.name, None, shape.keyset, after=cursor, limit=limit,
                                     lower=[start] if start is not None else None, upper=end,
                                     sort_nullable=shape.sort_nullable)
    def column(c: str) -> sql.Composable:
        return sql.SQL("p.{}").format(sql.Identifier(escape_percent(c)))

    col = {c: column(c) for c in (*shape.keyset, *shape.primary_key)}
    record: sql.Composable = sql.SQL("to_jsonb(p)")
    if shape.json_columns:
        record = _json_record(shape, column)
    texts = _texts(shape, column)
    params: list[object] = [backfill_id, page_no]
    tup: sql.Composable = sql.SQL("NULL::text")
    if typed is not None:
        record = texts = sql.SQL("NULL::jsonb")
        tup = sql.SQL("ROW({})::text").format(
            sql.SQL(", ").join(sql.SQL("p.{}").format(sql.Identifier(escape_percent(c))) for c, _ in typed))
    elif shape.generated and not shape.json_columns:  # left out as the stream leaves them out
        record = sql.SQL("({} - %s::text[])").format(record)
        params.append(list(shape.generated))
    # Typed as the staging table's columns: binary COPY carries values in their own types' formats.
    query = sql.SQL(
        "SELECT %s::text, %s::integer, (row_number() OVER w)::integer, jsonb_build_array({pk})::text, {record}, {tup}, {texts}, "
        "CASE WHEN lead(true) OVER w IS NULL THEN jsonb_build_array({cursor})::text END "
        "FROM ({inner}) p WINDOW w AS (ORDER BY {order})"
    ).format(
        pk=sql.SQL(", ").join(col[k] for k in shape.primary_key),
        record=record,
        tup=tup,
        texts=texts,
        cursor=sql.SQL(", ").join(sql.SQL("{}::text").format(col[k]) for k in shape.keyset),
        inner=inner,
        order=sql.SQL(", ").join(col[k] for k in shape.keyset),
    )
    return _render(conn, query, [*params, *inner_params])


@dataclass
class Page:
    rows: int
    cursor: list[str] | None
    read_ms: float
    token: str


def parse_cursor(text: str | None) -> list[str] | None:
    return None if text is None else [str(v) for v in json.loads(text)]


def _last_cursor(chunk: bytes, rows: int) -> list[str] | None:
    """The cursor in a page's last tuple (binary COPY; its last field, text, set on the last row only).
    Its seq (row_number, int4) must equal the tuples counted: a page is never taken as shorter than it is."""
    fields = tuple_fields(chunk)
    if not fields or fields[2] is None or int.from_bytes(fields[2], "big", signed=True) != rows:
        raise RuntimeError(f"backfill page: COPY relay counted {rows} tuples but the last one does not say so")
    value = fields[-1]
    return parse_cursor(value.decode()) if value is not None else None


def emit(src: psycopg.Connection, mark: Watermark, key: str) -> None:
    """Emit a watermark signed with the backfill's key (``mac_key``), as a transactional message."""
    with src.transaction():
        if mark.kind == "high":
            # The high watermark carries its own transaction's xid: assigned after the page's snapshot, it
            # bounds the transactions the snapshot may have missed (watermark.Snapshot.unseen). Taken in the
            # same transaction as the message, so the signed content holds it.
            row = src.execute("SELECT pg_current_xact_id()::text").fetchone()
            assert row is not None
            mark = replace(mark, xid=int(row[0]))
        src.execute("SELECT pg_logical_emit_message(true, %s, %s)", (WATERMARK_PREFIX, mark.encode(key)))


@dataclass(frozen=True)
class PageReader:
    """Reads pages of one backfill's table (``spec``) and stages them in the state schema."""

    schema: str  # the state schema
    spec: BackfillSpec
    shape: TableShape
    same_db: bool
    max_query_ms: int
    typed: Columns | None = None  # the backfill's typed shape, if it reads typed rows (backfill/typed.py)

    def _lock(self, src: psycopg.Connection) -> None:
        """The page transaction's first statement, before its snapshot (LOCK takes none): the table locked as
        the select would lock it. An ALTER TABLE that rewrites the table (a type change) and commits between
        the snapshot and the select would leave the select an empty table (the rewritten rows are the ALTER's,
        newer than the snapshot: not MVCC-safe), and the page would end the backfill early; and no ALTER TABLE
        lands between the typed shape's look at the catalog and the select."""
        src.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
            sql.Identifier(self.shape.schema, self.shape.name)))

    def _page_shape(self, src: psycopg.Connection) -> Columns | None:
        """In the page's transaction, once locked (``_lock``): the typed shape if the table still has it, else
        None (a JSON page): a page never reads columns its typed shape does not name."""
        if self.typed is None:
            return None
        if typed_columns(src, self.shape.schema, self.shape.name, self.shape.generated) != self.typed:
            return None
        # Text output must read back as the same value wherever it is parsed (session.JSON_OPTIONS sets the
        # time zone and date styles).
        src.execute("SET LOCAL bytea_output = 'hex'")
        src.execute("SET LOCAL extra_float_digits = 1")
        return self.typed

    def _prepare(self, src: psycopg.Connection) -> None:
        """The session's helper for `json` columns (a temporary function: nothing is left in the source)."""
        if self.shape.json_columns and self.typed is None:
            src.execute(_JSON_FUNCTION)

    def read_and_stage(self, src: psycopg.Connection, state: psycopg.Connection, bid: str, page_no: int,
                       cursor: list[str] | None, size: int) -> Page:
        if self.same_db:
            return self._stage_in_place(src, bid, page_no, cursor, size)
        return self._stage_across(src, state, bid, page_no, cursor, size)

    def _begin_page(self, src: psycopg.Connection, bid: str, page_no: int, cursor: list[str] | None,
                    size: int) -> tuple[str, datetime, str]:
        """In the page's transaction: its runner lock, snapshot and read time, and its select, with the
        statement timeout set for the read."""
        self._lock(src)
        snap, read_at = src.execute("SELECT pg_current_snapshot()::text, now()").fetchone()  # type: ignore[misc]
        self._prepare(src)
        select = page_sql(src, self.shape, bid, page_no, cursor, self.spec.start, self.spec.end, size,
                          self._page_shape(src))
        src.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(self.max_query_ms)))
        return str(snap), read_at, select

    def _stage_in_place(self, src: psycopg.Connection, bid: str, page_no: int, cursor: list[str] | None,
                        size: int) -> Page:
        """The state lives in the source database: read and stage in one statement, in the page's own
        transaction, so the rows never leave the server."""
        pages = PageStore(self.schema)
        with src.transaction():
            snap, read_at, select = self._begin_page(src, bid, page_no, cursor, size)
            t0 = time.perf_counter()
            row = src.execute(sql.SQL(
                "WITH ins AS (INSERT INTO {} {} RETURNING cursor) SELECT count(*), max(cursor) FROM ins"
            ).format(pages.rows_table(), sql.SQL(select))).fetchone()
            read_ms = (time.perf_counter() - t0) * 1000
            assert row is not None
            rows, last_cursor = int(row[0]), row[1]
            src.execute("SET LOCAL statement_timeout = 0")
            cur = parse_cursor(last_cursor)
            pages.record_page(src, bid, page_no, snap, read_at, size, rows, read_ms, cur)
        return Page(rows, cur, read_ms, page_token(snap, read_at))

    def _stage_across(self, src: psycopg.Connection, state: psycopg.Connection, bid: str, page_no: int,
                      cursor: list[str] | None, size: int) -> Page:
        """The state lives elsewhere: stream binary COPY TO -> COPY FROM, a block at a time, so memory stays
        bounded whatever the page and row sizes; neither server escapes or unescapes text, and this process
        only counts chunks. The page's time includes staging, as in place."""
        pages = PageStore(self.schema)
        before = last = b""
        with state.transaction(), src.transaction():
            snap, read_at, select = self._begin_page(src, bid, page_no, cursor, size)
            t0 = time.perf_counter()
            with state.cursor().copy(sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(pages.rows_table())) \
                    as sink, src.cursor().copy(sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(sql.SQL(select))) \
                    as source:
                block: list[bytes] = []
                block_bytes = 0
                # One tuple per chunk, the header riding on the first; the trailer comes last, alone (or
                # with the header when there are no rows).
                chunks = 0
                for data in source:
                    chunk = bytes(data)
                    before, last = last, chunk
                    chunks += 1
                    block.append(chunk)
                    block_bytes += len(chunk)
                    if block_bytes >= COPY_BLOCK:
                        sink.write(b"".join(block))
                        block, block_bytes = [], 0
                if block:
                    sink.write(b"".join(block))
            rows = max(0, chunks - 1)
            read_ms = (time.perf_counter() - t0) * 1000
            cur = _last_cursor(before, rows) if rows else None
            pages.record_page(state, bid, page_no, snap, read_at, size, rows, read_ms, cur)
        return Page(rows, cur, read_ms, page_token(snap, read_at))

    def estimate(self, src: psycopg.Connection) -> int | None:
        """Rows in the window: counted under the time limit, else the planner's estimate (full backfills)."""
        shape = self.shape
        query, params = count_query(shape.schema, shape.name, shape.keyset,
                                    lower=[self.spec.start] if self.spec.start is not None else None,
                                    upper=self.spec.end, sort_nullable=shape.sort_nullable)
        try:
            with src.transaction():
                src.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(self.max_query_ms)))
                row = src.execute(query, params).fetchone()
                return int(row[0]) if row else None
        except psycopg.errors.QueryCanceled:
            if self.spec.sort_column is not None:
                return None
            return catalog.estimated_rows(src, shape.schema, shape.name)

    def ensure_relation(self, src: psycopg.Connection, state: psycopg.Connection) -> None:
        """Sinks learn a table's columns from the drain's Relation messages, which only come with a change:
        a table that has not changed since the slot was created is described here, from the catalog, as
        the drain would (the generated columns the stream leaves out recorded for a mirror to compute)."""
        shape = self.shape
        info = catalog.describe_table(src, shape.schema, shape.name)
        oid = catalog.table_oid(src, shape.schema, shape.name)
        if info is None or oid is None:
            return
        types = catalog.load_types(src, {c.type_oid for c in info.columns})
        columns = [column_record(c.name, c.type_oid, c.type_sql, info.replica_identity == "f" or c.in_primary_key,
                                 types) for c in info.columns if c.name not in shape.generated]
        columns += generated_records([g for g in catalog.generated_columns(src, shape.schema, shape.name)
                                      if g.name in shape.generated])
        upsert_relation(state, self.schema, shape.schema, shape.name, oid, info.replica_identity, columns,
                        info.primary_key, replace=False)
