"""The backfill runner: keyset pages between watermarks, staged for the drain to reconcile.

Per page (DESIGN.md step 3):
  1. emit the low watermark (a transactional logical message, its own transaction);
  2. in one REPEATABLE READ transaction take ``pg_current_snapshot()`` and read the page
     ``WHERE (keyset) > (cursor) ORDER BY keyset LIMIT n`` under ``SET LOCAL statement_timeout``,
     the size chosen by the PageSizeOptimizer (a timeout shrinks it and the page is read again);
  3. stage the rows, the snapshot and the page's cursor in the state database (when the state lives
     in the source database, 2 and 3 are one ``INSERT ... SELECT``: the rows never leave the server;
     otherwise they are streamed ``COPY TO`` -> ``COPY FROM``);
  4. emit the high watermark. The drain reconciles the page when it reaches it
     (capture/reconcile.py) and checkpoints the cursor in the same transaction.

Up to ``backfill.max_staged_pages`` pages wait for the drain at a time, and reading pauses while a
target sink's backlog exceeds ``backfill.max_sink_backlog``. Between pages the runner follows the
backfill's status (pause, resume, cancel). Resuming after a crash re-sends the high watermark of
every staged page (a page whose high watermark did get out is reconciled once; the re-sent one is a
no-op) and reads on from the last staged page: only a page that was being read is read again.

Rows whose sort column is NULL are not part of a partial backfill (they have no position in the
order); a full backfill orders by the primary key, which is never NULL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cdc_pipeline.backfill.copytext import parse_line
from cdc_pipeline.backfill.page_size import PageSizeOptimizer
from cdc_pipeline.backfill.state import BackfillConflict, BackfillError, BackfillSpec, BackfillStore
from cdc_pipeline.backfill.watermark import WATERMARK_PREFIX, Watermark, page_token
from cdc_pipeline.capture.drain import SESSION_OPTIONS
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog
from cdc_pipeline.postgres.keyset import count_query, page_query
from cdc_pipeline.state.store import Store

log = logging.getLogger(__name__)

APP_NAME = "cdc_pipeline.backfill"
COPY_BLOCK = 1 << 20
POLL_SECONDS = 0.05
BACKLOG_CHECK_SECONDS = 1.0
BACKLOG_COUNT_SECONDS = 10.0
NO_DRAIN_WARNING_SECONDS = 10.0


@dataclass(frozen=True)
class BackfillRequest:
    """A backfill as asked for by the CLI or a Dagster run (resolved against the config by the runner)."""

    table: str
    sinks: tuple[str, ...] = ()  # empty: every sink that receives the table
    sort_column: str | None = None  # None: the table's sort_column when start/end are given
    start: str | None = None  # inclusive
    end: str | None = None  # exclusive
    max_query_ms: int | None = None  # None: backfill.max_query_ms from the config
    origin: str = "cli"


@dataclass
class Progress:
    """What a runner reports while it works and when it stops."""

    backfill_id: str
    spec: BackfillSpec
    status: str  # running | paused | waiting | completing | completed | cancelled | interrupted
    resumed: bool = False
    resumed_from_page: int = 0
    pages_staged: int = 0  # pages read and staged, all runs of this backfill
    rows_staged: int = 0
    pages: int = 0  # pages reconciled by the drain (the checkpoint)
    rows_read: int = 0  # rows of reconciled pages
    rows_dropped: int = 0  # of those, dropped as stale (a change represents the row)
    page_size: int = 0
    cursor: list[str] | None = None
    estimated_rows: int | None = None
    rows_read_this_run: int = 0
    page_attempts_this_run: int = 0
    timeouts: int = 0
    seconds: float = 0.0
    note: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.rows_read_this_run / self.seconds if self.seconds > 0 else 0.0

    @property
    def rows_emitted(self) -> int:
        return self.rows_read - self.rows_dropped

    def line(self) -> str:
        est = f"/~{self.estimated_rows}" if self.estimated_rows else ""
        text = (f"backfill {self.backfill_id} {self.status}: {self.rows_staged}{est} rows read in {self.pages_staged} "
                f"pages ({self.rate:,.0f} rows/s, page size {self.page_size}); checkpoint: {self.pages} pages, "
                f"{self.rows_emitted} rows emitted, {self.rows_dropped} dropped as stale, cursor {self.cursor}")
        return text + (f"; {self.note}" if self.note else "")

    def as_metadata(self) -> dict[str, Any]:
        return {
            "backfill_id": self.backfill_id, "status": self.status, "table": self.spec.table,
            "sinks": ", ".join(self.spec.sinks), "window": self.spec.describe(),
            "rows_read": self.rows_read, "rows_emitted": self.rows_emitted, "rows_dropped": self.rows_dropped,
            "pages": self.pages, "rows_read_this_run": self.rows_read_this_run,
            "rate_rows_per_s": round(self.rate, 1), "page_size": self.page_size,
            "page_timeouts": self.timeouts, "cursor": str(self.cursor), "resumed": self.resumed,
            "resumed_from_page": self.resumed_from_page, "seconds": round(self.seconds, 2),
        }


@dataclass(frozen=True)
class TableShape:
    schema: str
    name: str
    primary_key: tuple[str, ...]
    keyset: tuple[str, ...]
    sort_nullable: bool
    generated: tuple[str, ...]
    sort_indexed: bool


def resolve(config: PipelineConfig, request: BackfillRequest) -> BackfillSpec:
    """The request checked against the config: table, sinks (default: all of the table's), window."""
    table = config.table(request.table)
    if request.sinks:
        for name in request.sinks:
            sink = config.sink(name)
            if table.qualified not in sink.tables:
                raise BackfillError(f"sink {name!r} does not receive {table.qualified} "
                                    f"(its tables: {', '.join(sink.tables)})")
        sinks = tuple(dict.fromkeys(request.sinks))
    else:
        sinks = tuple(s.name for s in config.sinks if table.qualified in s.tables)
        if not sinks:
            raise BackfillError(f"no sink receives {table.qualified}: add it to a sink's tables, or name one")
    sort = request.sort_column
    if sort is None and (request.start is not None or request.end is not None):
        sort = table.sort_column
        if sort is None:
            raise BackfillError(f"a start or end position needs a sort column: pass --sort-column, or set "
                                f"sort_column for {table.qualified} in the config")
    return BackfillSpec(table.qualified, tuple(sorted(sinks)), sort, request.start, request.end)


def describe(conn: psycopg.Connection, spec: BackfillSpec) -> TableShape:
    info = catalog.describe_table(conn, spec.schema_name, spec.table_name)
    if info is None:
        raise BackfillError(f"table {spec.table} does not exist in the source database")
    if not info.primary_key:
        raise BackfillError(f"table {spec.table} has no primary key: a backfill pages by it "
                            f"(ALTER TABLE {spec.table} ADD PRIMARY KEY (...))")
    rel = "to_regclass(format('%%I.%%I', %s::text, %s::text))"
    attrs = {r[0]: (bool(r[1]), bool(r[2])) for r in conn.execute(
        f"SELECT attname, attnotnull, attgenerated <> '' FROM pg_attribute WHERE attrelid = {rel} "
        "AND attnum > 0 AND NOT attisdropped", (spec.schema_name, spec.table_name)).fetchall()}
    generated = tuple(name for name, (_, gen) in attrs.items() if gen)
    sort = spec.sort_column
    if sort is None:
        return TableShape(spec.schema_name, spec.table_name, info.primary_key, info.primary_key, False, generated, True)
    if sort not in attrs:
        raise BackfillError(f"sort column {sort!r} does not exist in {spec.table}")
    row = conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        f"AND a.attnum = i.indkey[0] WHERE i.indrelid = {rel} AND a.attname = %s AND i.indpred IS NULL)",
        (spec.schema_name, spec.table_name, sort)).fetchone()
    keyset = (sort, *(k for k in info.primary_key if k != sort))
    return TableShape(spec.schema_name, spec.table_name, info.primary_key, keyset, not attrs[sort][0], generated,
                      bool(row and row[0]))


def _escape(name: str) -> str:
    return name.replace("%", "%%")  # see postgres/keyset.py: queries are rendered with % formatting


def _render(conn: psycopg.Connection, query: sql.Composable, params: Sequence[object]) -> str:
    """The query with its %s placeholders replaced by literals (COPY takes no parameters). Values go
    in as untyped literals, so PostgreSQL reads each with the type of the column it meets."""
    return query.as_string(conn) % tuple(sql.Literal(p).as_string(conn) for p in params)


def page_sql(conn: psycopg.Connection, shape: TableShape, backfill_id: str, page_no: int,
             cursor: Sequence[str] | None, start: str | None, end: str | None, limit: int) -> str:
    """SELECT (backfill_id, page_no, seq, pk, record, cursor) for one page; cursor is set on its last row only.

    ``pk`` is the JSON array text of the key as the drain writes it (``[1, "a"]``); ``record`` is
    ``to_jsonb`` of the row, as the drain's records are.
    """
    inner, inner_params = page_query(shape.schema, shape.name, None, shape.keyset, after=cursor, limit=limit,
                                     lower=[start] if start is not None else None, upper=end,
                                     sort_nullable=shape.sort_nullable)
    col = {c: sql.SQL("p.{}").format(sql.Identifier(_escape(c))) for c in (*shape.keyset, *shape.primary_key)}
    record: sql.Composable = sql.SQL("to_jsonb(p)")
    params: list[object] = [backfill_id, page_no]
    if shape.generated:  # pgoutput does not send generated columns; nor do reads
        record = sql.SQL("(to_jsonb(p) - %s::text[])")
        params.append(list(shape.generated))
    query = sql.SQL(
        "SELECT %s, %s, row_number() OVER w, jsonb_build_array({pk})::text, {record}, "
        "CASE WHEN lead(true) OVER w IS NULL THEN jsonb_build_array({cursor})::text END "
        "FROM ({inner}) p WINDOW w AS (ORDER BY {order})"
    ).format(
        pk=sql.SQL(", ").join(col[k] for k in shape.primary_key),
        record=record,
        cursor=sql.SQL(", ").join(sql.SQL("{}::text").format(col[k]) for k in shape.keyset),
        inner=inner,
        order=sql.SQL(", ").join(col[k] for k in shape.keyset),
    )
    return _render(conn, query, [*params, *inner_params])


@dataclass
class _Page:
    rows: int
    cursor: list[str] | None
    read_ms: float
    token: str


class Backfiller:
    """Runs one backfill to completion (or until paused for good, cancelled or stopped).

    ``run()`` returns the final Progress; ``on_progress`` gets one at most every ``progress_seconds``
    while it runs. ``wait_if_busy``: when another live process runs a backfill for the same table and
    sink, wait for it instead of failing (Dagster runs of several partitions).
    """

    def __init__(self, config: PipelineConfig, request: BackfillRequest,
                 on_progress: Callable[[Progress], None] | None = None, progress_seconds: float = 2.0,
                 wait_if_busy: bool = False) -> None:
        self.config = config
        self.request = request
        self.spec = resolve(config, request)
        self.on_progress = on_progress
        self.progress_seconds = progress_seconds
        self.wait_if_busy = wait_if_busy
        self.max_query_ms = request.max_query_ms or config.backfill.max_query_ms
        self.store = BackfillStore(config.state.schema_name)
        self.log_store = Store(config.state.schema_name)
        self.same_db = config.state.dsn is None or config.state.dsn == config.source.dsn
        self._stop = threading.Event()
        self._last_report = 0.0
        self._last_backlog_check = 0.0
        self._last_backlog_count = 0.0
        self._backlog_note = ""
        self._backlog_estimate = 0
        self._waiting_since: float | None = None
        self._cleaned_upto = -1
        self.progress: Progress | None = None

    def stop(self) -> None:
        """Stop between pages; the backfill stays active and resumes from its checkpoint next time."""
        self._stop.set()

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> Progress:
        started = time.monotonic()
        src = psycopg.connect(self.config.source.dsn, autocommit=True, options=SESSION_OPTIONS,
                              application_name=APP_NAME)
        state: psycopg.Connection | None = None
        try:
            src.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            state = psycopg.connect(self.config.state_dsn, autocommit=True, options=SESSION_OPTIONS,
                                    application_name=APP_NAME)
            shape = describe(src, self.spec)
            warnings = []
            if not shape.sort_indexed:
                warnings.append(f"sort column {self.spec.sort_column!r} of {self.spec.table} is not the first column "
                                f"of any index: every page scans the table; consider CREATE INDEX ON "
                                f"{self.spec.table} ({self.spec.sort_column})")
                log.warning(warnings[-1])
            self._ensure_relation(src, state, shape)
            backfill_id, resumed = self._claim(state, shape)
            progress = self.progress = Progress(backfill_id, self.spec, "running", resumed=resumed, warnings=warnings)
            if not resumed:
                estimate = self._estimate(src, shape)
                state.execute(sql.SQL("UPDATE {}.backfills SET estimated_rows = %s WHERE id = %s")
                              .format(self.store.s), (estimate, backfill_id))
            try:
                self._run(src, state, shape, progress, started)
            except BaseException as exc:
                progress.status = "failed"
                self._record_error(state, backfill_id, f"{type(exc).__name__}: {exc}")
                raise
            return progress
        finally:
            src.close()
            if state is not None:
                state.close()  # releases the runner lock

    def _ensure_relation(self, src: psycopg.Connection, state: psycopg.Connection, shape: TableShape) -> None:
        """Sinks learn a table's columns from the drain's Relation messages, which only come with a change:
        a table that has not changed since the slot was created is described here, from the catalog, as
        the drain would (generated columns left out, as pgoutput does)."""
        info = catalog.describe_table(src, shape.schema, shape.name)
        row = src.execute("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text))::oid",
                          (shape.schema, shape.name)).fetchone()
        if info is None or row is None:
            return
        columns = [{"name": c.name, "type_oid": c.type_oid, "type_sql": c.type_sql,
                    "key": info.replica_identity == "f" or c.in_primary_key}
                   for c in info.columns if c.name not in shape.generated]
        state.execute(sql.SQL(
            "INSERT INTO {}.relations (table_schema, table_name, relation_id, replica_identity, columns, primary_key, "
            "updated_at) VALUES (%s, %s, %s, %s, %s, %s, now()) ON CONFLICT DO NOTHING").format(self.store.s),
            (shape.schema, shape.name, int(row[0]), info.replica_identity, Jsonb(columns), list(info.primary_key)))

    def _claim(self, state: psycopg.Connection, shape: TableShape) -> tuple[str, bool]:
        waited = 0.0
        while True:
            try:
                return self.store.claim(state, self.spec, shape.primary_key, shape.keyset, self.request.origin, None)
            except BackfillConflict as exc:
                if not (self.wait_if_busy and exc.alive) or self._stop.is_set():
                    raise
                if waited == 0.0 or waited >= 30:
                    log.info("waiting: %s", exc)
                    waited = 0.0
                time.sleep(1.0)
                waited += 1.0

    def _estimate(self, src: psycopg.Connection, shape: TableShape) -> int | None:
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
            row = src.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = "
                              "to_regclass(format('%%I.%%I', %s::text, %s::text))", (shape.schema, shape.name)).fetchone()
            return int(row[0]) if row else None

    def _record_error(self, state: psycopg.Connection, backfill_id: str, error: str) -> None:
        try:
            if not state.closed and state.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                self.store.record_error(state, backfill_id, error[:2000])
        except psycopg.Error as exc:  # the state database is what failed: nothing to record it in
            log.warning("backfill %s failed (%s) and the error could not be recorded: %s",
                        backfill_id, error[:200], type(exc).__name__)

    def _run(self, src: psycopg.Connection, state: psycopg.Connection, shape: TableShape, progress: Progress,
             started: float) -> None:
        bid = progress.backfill_id
        cfg = self.config.backfill
        pages = self.store.pages(state, bid)
        for page in pages:
            if page["status"] == "staged":  # see the module docstring
                self._emit(src, Watermark(bid, page["page_no"], "high", token=page_token(page["snapshot"],
                                                                                         page["read_at"])))
        last = pages[-1] if pages else None
        next_page = last["page_no"] + 1 if last else 0
        cursor: list[str] | None = list(last["cursor"]) if last and last["cursor"] is not None else None
        reading = not (last and last["last"])
        progress.resumed_from_page = next_page if progress.resumed else 0
        progress.pages_staged = len(pages)
        progress.rows_staged = sum(int(p["rows"]) for p in pages)
        initial = next((int(p["page_size"]) for p in reversed(pages)), cfg.initial_page_size)
        optimizer = PageSizeOptimizer(max_query_ms=self.max_query_ms, initial=min(initial, cfg.max_page_size),
                                      maximum=cfg.max_page_size)
        progress.page_size = optimizer.size
        if progress.resumed:
            log.info("backfill %s: resuming at page %s, cursor %s", bid, next_page, cursor)
        while reading:
            if self._stop.is_set():
                progress.status = "interrupted"
                break
            status = self.store.status(state, bid)
            if status == "cancelled":
                progress.status = "cancelled"
                break
            if status == "paused":
                self._report(state, progress, started, "paused", "paused: `cdc-pipeline backfill resume " + bid + "`")
                time.sleep(0.5)
                continue
            wait = self._must_wait(state, bid)
            if wait:
                self._report(state, progress, started, "waiting", wait)
                time.sleep(POLL_SECONDS)
                continue
            self._waiting_since = None
            state.execute(sql.SQL("UPDATE {}.backfill_readers SET page_attempts = page_attempts + 1, "
                                  "updated_at = now() WHERE backfill_id = %s").format(self.store.s), (bid,))
            progress.page_attempts_this_run += 1
            self._emit(src, Watermark(bid, next_page, "low"))
            while True:
                size = optimizer.size
                try:
                    page = self._read_and_stage(src, state, shape, bid, next_page, cursor, size)
                    break
                except psycopg.errors.QueryCanceled:
                    progress.timeouts += 1
                    optimizer = optimizer.observe_timeout(size)
                    log.info("backfill %s page %s: select of %s rows exceeded %s ms; next try %s rows",
                             bid, next_page, size, self.max_query_ms, optimizer.size)
            self._emit(src, Watermark(bid, next_page, "high", token=page.token))
            optimizer = optimizer.observe(size, page.read_ms, page.rows)
            progress.pages_staged += 1
            progress.rows_staged += page.rows
            progress.rows_read_this_run += page.rows
            self._backlog_estimate += page.rows
            progress.page_size = optimizer.size
            if page.cursor is not None:
                cursor = page.cursor
            progress.cursor = cursor
            reading = page.rows >= size
            next_page += 1
            self._cleanup(state, bid)
            self._report(state, progress, started, "running" if reading else "completing")
        if progress.status not in ("interrupted", "cancelled"):
            self._await_completion(state, progress, started)
        if progress.status in ("completed", "cancelled"):
            self.store.cleanup(state, bid)
        self._report(state, progress, started, progress.status, force=True)

    def _await_completion(self, state: psycopg.Connection, progress: Progress, started: float) -> None:
        """The last page is staged: wait for the drain to reconcile everything."""
        bid = progress.backfill_id
        self._waiting_since = time.monotonic()
        while True:
            status = self.store.status(state, bid)
            if status in ("completed", "cancelled"):
                progress.status = status
                return
            if self._stop.is_set():
                progress.status = "interrupted"
                return
            note = "waiting for the drain to reconcile the last pages" + self._drain_hint(state)
            self._report(state, progress, started, "completing", note)
            self._cleanup(state, bid)
            time.sleep(POLL_SECONDS)

    # -- one page ---------------------------------------------------------------------------------
    def _emit(self, src: psycopg.Connection, mark: Watermark) -> None:
        if mark.kind == "low":
            src.execute("SELECT pg_logical_emit_message(true, %s, %s)", (WATERMARK_PREFIX, mark.encode()))
        else:
            # The high watermark carries its own xid: assigned after the page's snapshot, it bounds the
            # transactions the snapshot may have missed (watermark.Snapshot.unseen).
            src.execute("SELECT pg_logical_emit_message(true, %s, json_build_object('id', %s::text, 'page', "
                        "%s::int, 'kind', 'high', 'xid', pg_current_xact_id()::text, 'token', %s::text)::text)",
                        (WATERMARK_PREFIX, mark.backfill_id, mark.page, mark.token))

    def _read_and_stage(self, src: psycopg.Connection, state: psycopg.Connection, shape: TableShape, bid: str,
                        page_no: int, cursor: list[str] | None, size: int) -> _Page:
        select = page_sql(src, shape, bid, page_no, cursor, self.spec.start, self.spec.end, size)
        s = self.store.s
        timeout = sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(self.max_query_ms))
        insert_page = sql.SQL(
            "INSERT INTO {}.backfill_pages (backfill_id, page_no, snapshot, read_at, page_size, rows, read_ms, "
            "cursor, last) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)").format(s)
        reader = sql.SQL("UPDATE {}.backfill_readers SET rows_fetched = rows_fetched + %s, page_size = %s, "
                         "updated_at = now() WHERE backfill_id = %s").format(s)
        if self.same_db:
            # The state lives in the source database: read and stage in one statement, in the
            # page's own transaction, so the rows never leave the server.
            with src.transaction():
                snap, read_at = src.execute("SELECT pg_current_snapshot()::text, now()").fetchone()  # type: ignore[misc]
                src.execute(timeout)
                t0 = time.perf_counter()
                row = src.execute(sql.SQL(
                    "WITH ins AS (INSERT INTO {}.backfill_rows (backfill_id, page_no, seq, pk, record, cursor) {} "
                    "RETURNING cursor) SELECT count(*), max(cursor) FROM ins").format(s, sql.SQL(select))).fetchone()
                read_ms = (time.perf_counter() - t0) * 1000
                assert row is not None
                rows, last_cursor = int(row[0]), row[1]
                src.execute("SET LOCAL statement_timeout = 0")
                cur = _parse_cursor(last_cursor)
                src.execute(insert_page, (bid, page_no, snap, read_at, size, rows, read_ms, cur, rows < size))
                src.execute(reader, (rows, size, bid))
            return _Page(rows, cur, read_ms, page_token(snap, read_at))
        # The state lives elsewhere: stream COPY TO -> COPY FROM, a block at a time, so memory stays
        # bounded whatever the page and row sizes. The page's time includes staging, as above.
        rows = 0
        last = b""
        with state.transaction(), src.transaction():
            snap, read_at = src.execute("SELECT pg_current_snapshot()::text, now()").fetchone()  # type: ignore[misc]
            src.execute(timeout)
            t0 = time.perf_counter()
            with state.cursor().copy(sql.SQL("COPY {}.backfill_rows (backfill_id, page_no, seq, pk, record, cursor) "
                                             "FROM STDIN").format(s)) as sink, \
                    src.cursor().copy(sql.SQL("COPY ({}) TO STDOUT").format(sql.SQL(select))) as source:
                block: list[bytes] = []
                block_bytes = 0
                for data in source:  # one row per chunk
                    last = bytes(data)
                    block.append(last)
                    block_bytes += len(last)
                    rows += 1
                    if block_bytes >= COPY_BLOCK:
                        sink.write(b"".join(block))
                        block, block_bytes = [], 0
                if block:
                    sink.write(b"".join(block))
            read_ms = (time.perf_counter() - t0) * 1000
            cur = _parse_cursor(parse_line(last)[-1]) if rows else None
            state.execute(insert_page, (bid, page_no, snap, read_at, size, rows, read_ms, cur, rows < size))
            state.execute(reader, (rows, size, bid))
        return _Page(rows, cur, read_ms, page_token(snap, read_at))

    # -- flow control -----------------------------------------------------------------------------
    def _must_wait(self, state: psycopg.Connection, bid: str) -> str:
        """Why the next page must wait (backpressure), or ''."""
        cfg = self.config.backfill
        row = state.execute(sql.SQL("SELECT count(*) FROM {}.backfill_pages WHERE backfill_id = %s "
                                    "AND status = 'staged'").format(self.store.s), (bid,)).fetchone()
        staged = int(row[0]) if row else 0
        if staged >= cfg.max_staged_pages:
            if self._waiting_since is None:
                self._waiting_since = time.monotonic()
            return f"{staged} pages wait for the drain (max_staged_pages {cfg.max_staged_pages})" + self._drain_hint(state)
        # A sink's backlog: this backfill's own share (rows in flight, and reads reconciled after the
        # sink's offset) is cheap to know from its pages and is checked every BACKLOG_CHECK_SECONDS, or
        # at once when the rows staged since say it may be over. Counting the log itself (other traffic
        # included, up to the limit) costs a scan of the backlog, so it runs every
        # BACKLOG_COUNT_SECONDS, or when our share alone comes near the limit.
        now = time.monotonic()
        limit = cfg.max_sink_backlog
        over = self._backlog_estimate > limit
        if not (over or now - self._last_backlog_check >= BACKLOG_CHECK_SECONDS):
            return self._backlog_note
        if over and self._backlog_note and now - self._last_backlog_check < BACKLOG_CHECK_SECONDS / 2:
            return self._backlog_note
        self._last_backlog_check = now
        count_log = now - self._last_backlog_count >= BACKLOG_COUNT_SECONDS
        self._backlog_estimate = 0
        self._backlog_note = ""
        for name in self.spec.sinks:
            offset = self.log_store.sink_offset(state, name)
            row = state.execute(sql.SQL(
                "SELECT coalesce(sum(rows) FILTER (WHERE status = 'staged'), 0), coalesce(sum(rows - dropped) "
                "FILTER (WHERE status = 'reconciled' AND (high_lsn, high_idx) > (%s, %s)), 0) "
                "FROM {}.backfill_pages WHERE backfill_id = %s").format(self.store.s),
                (offset[0], offset[1], bid)).fetchone()
            in_flight, ours = (int(row[0]), int(row[1])) if row else (0, 0)
            backlog = in_flight + ours
            if backlog <= limit and (count_log or backlog > limit // 2):
                sink = self.config.sink(name)
                backlog = in_flight + self.log_store.backlog(state, sink.tables, offset, name, limit + 1)
                self._last_backlog_count = now
            self._backlog_estimate = max(self._backlog_estimate, backlog)
            if backlog > limit and not self._backlog_note:
                self._backlog_note = (f"sink {name} has more than {limit} undelivered messages "
                                      f"(max_sink_backlog): waiting for delivery")
        return self._backlog_note

    def _drain_hint(self, state: psycopg.Connection) -> str:
        if self._waiting_since is None or time.monotonic() - self._waiting_since < NO_DRAIN_WARNING_SECONDS:
            return ""
        if self.store.drain_running(state, self.config.source.slot):
            return ""
        return " (no drain is running: start `cdc-pipeline drain` or the Dagster drain sensor)"

    def _cleanup(self, state: psycopg.Connection, bid: str) -> None:
        """Delete the staged rows of pages the drain has reconciled (it no longer needs them)."""
        row = state.execute(sql.SQL("SELECT max(page_no) FROM {}.backfill_pages WHERE backfill_id = %s "
                                    "AND status = 'reconciled'").format(self.store.s), (bid,)).fetchone()
        done = row[0] if row and row[0] is not None else -1
        if done > self._cleaned_upto:
            state.execute(sql.SQL("DELETE FROM {}.backfill_rows WHERE backfill_id = %s AND page_no > %s "
                                  "AND page_no <= %s").format(self.store.s), (bid, self._cleaned_upto, done))
            self._cleaned_upto = done

    def _report(self, state: psycopg.Connection, progress: Progress, started: float, status: str,
                note: str = "", force: bool = False) -> None:
        progress.status = status
        progress.note = note
        progress.seconds = time.monotonic() - started
        now = time.monotonic()
        if not force and now - self._last_report < self.progress_seconds:
            return
        self._last_report = now
        info = self.store.get(state, progress.backfill_id)
        progress.pages, progress.rows_read, progress.rows_dropped = info.pages, info.rows_read, info.rows_dropped
        progress.estimated_rows = info.estimated_rows
        if progress.cursor is None:
            progress.cursor = info.cursor
        if note and status in ("waiting", "completing", "paused"):
            log.info(progress.line())
        if self.on_progress is not None:
            self.on_progress(progress)


def _parse_cursor(text: str | None) -> list[str] | None:
    import json

    return None if text is None else [str(v) for v in json.loads(text)]


def run_backfill(config: PipelineConfig, request: BackfillRequest, **kw: Any) -> Progress:
    return Backfiller(config, request, **kw).run()
