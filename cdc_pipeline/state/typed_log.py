"""Runs of typed reads in the log, streamed to a sink that writes them as they are (sinks/postgres/typed.py).

A sink that takes typed rows gets the log in runs: the messages after its offset up to the first one of the
other kind. A run of typed reads never becomes Arrow or Python objects: it is relayed as COPY text from the
state database straight into the destination's COPY, a block at a time, in the form the sink asks for
(``RunRows``: rows ``seq, table_schema, table_name, shape, tup``, or the bare composite texts). ``TypedRun``
says what a run holds: read off its reconciled pages' position ranges (``page_run``) or found with one index
scan that reads no ``tup`` (``head_run``), so the relay is bounded by the run's last position and checked
against its row count."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from cdc_pipeline.state.base import Position, StateError
from cdc_pipeline.state.typed_rows import Columns, shapes

RELAY_BLOCK = 1 << 20


@dataclass(frozen=True)
class TypedRun:
    """The run at the head of a sink's log: typed reads (``typed``) or other messages, ``count`` of them."""

    typed: bool
    count: int
    last: Position
    last_commit_ts: datetime
    shapes: tuple[Columns, ...] = ()  # typed: the row shapes, by shape number
    shape_of: dict[str, int] | None = None  # typed: each backfill's shape number
    tables: tuple[tuple[str, str], ...] = ()  # typed: (schema, table) of its reads


def _where(s: sql.Composable, routing: sql.Composable) -> sql.Composable:
    return sql.SQL("FROM {}.change_log WHERE (commit_lsn, commit_idx) > (%s, %s) "
                   "AND table_schema || '.' || table_name = ANY(%s) {}").format(s, routing)


def scan_in_log_order(conn: psycopg.Connection) -> None:
    """For this transaction: read the log in its key's order, in this process. Without the hint the planner
    underestimates how many rows match the table filter and sorts every row after the offset; a batch is
    too small to be worth parallel workers or JIT compilation (which the sort's penalty would trigger)."""
    conn.execute("SET LOCAL enable_sort = off")
    conn.execute("SET LOCAL jit = off")
    conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")


def head_run(conn: psycopg.Connection, schema: str, routing: sql.Composable, params: Sequence[object],
             after: Position, limit: int) -> TypedRun | None:
    """The run at the head of the log after ``after`` (at most ``limit`` messages), None when there is none.
    ``routing`` and ``params`` select the sink's messages (tables, then the routing's own parameters)."""
    where = _where(sql.Identifier(schema), routing)
    scan_in_log_order(conn)
    # One ordered pass over the next `limit` messages, without their rows: the run is the messages before
    # the first one whose kind is not the first one's; grouped by backfill and table (a few rows).
    head = sql.SQL("(SELECT tup IS NOT NULL {where}ORDER BY commit_lsn, commit_idx LIMIT 1)").format(where=where)
    groups = conn.execute(sql.SQL(
        "SELECT x.typed, x.backfill_id, x.table_schema, x.table_name, count(*), "
        "  max(ARRAY[x.commit_lsn, x.commit_idx]), max(x.commit_ts) "
        "FROM (SELECT w.*, bool_and(w.typed = {head}) OVER (ORDER BY w.commit_lsn, w.commit_idx) AS same FROM ("
        "  SELECT commit_lsn, commit_idx, commit_ts, backfill_id, table_schema, table_name, tup IS NOT NULL AS typed "
        "  {where}ORDER BY commit_lsn, commit_idx LIMIT %s) w) x "
        "WHERE x.same GROUP BY 1, 2, 3, 4").format(head=head, where=where),
        (*after, *params, *after, *params, limit)).fetchall()
    if not groups:
        return None
    last = max((int(g[5][0]), int(g[5][1])) for g in groups)
    run = TypedRun(bool(groups[0][0]), sum(int(g[4]) for g in groups), last, max(g[6] for g in groups))
    if not run.typed:
        return run
    bids = sorted({str(g[1]) for g in groups})
    tables = sorted({(str(g[2]), str(g[3])) for g in groups})
    by_bid = shapes(conn, schema, list(bids))
    if set(by_bid) != set(bids):  # a typed read without its backfill's shape: not for the relay
        return TypedRun(False, run.count, run.last, run.last_commit_ts)
    numbers: dict[Columns, int] = {}
    shape_of = {bid: numbers.setdefault(cols, len(numbers)) for bid, cols in by_bid.items()}
    return TypedRun(True, run.count, run.last, run.last_commit_ts, tuple(numbers), shape_of, tuple(tables))


PAGES_AHEAD = 16  # reconciled pages looked at for one run (a run is at most a batch: a few pages)


def page_run(conn: psycopg.Connection, schema: str, tables: Sequence[str], sink: str, after: Position,
             limit: int) -> TypedRun | None:
    """The run at the head of a sink's log when it is typed reads of reconciled pages and nothing else, found
    from the pages' position ranges (a page's reads are logged at ``(high_lsn, high_idx + seq - 1)``, seq
    1..rows, a dropped read leaving its position empty) instead of a scan with a window: the run is the
    pages' reads after ``after`` up to ``limit``, and it is that only if the log holds exactly so many rows in
    the range, all typed reads of those backfills (one count over the key's index range). None: not so
    (another message in the range, a JSON page, a cut inside a page with dropped reads): ``head_run`` finds
    the run. The log's reconciliation (state/reconciliation.py) is trusted for nothing but finding the range."""
    s = sql.Identifier(schema)
    pages = conn.execute(sql.SQL(
        "SELECT p.backfill_id, p.high_lsn, p.high_idx, p.rows, p.dropped, b.table_schema, b.table_name "
        "FROM {s}.backfill_pages p JOIN {s}.backfills b ON b.id = p.backfill_id WHERE %s = ANY(b.sinks) "
        "AND b.table_schema || '.' || b.table_name = ANY(%s) AND b.typed_columns IS NOT NULL "
        "AND p.status = 'reconciled' AND (p.high_lsn, p.high_idx + p.rows - 1) > (%s, %s) "
        "ORDER BY p.high_lsn, p.high_idx LIMIT %s").format(s=s),
        (sink, list(tables), *after, PAGES_AHEAD)).fetchall()
    spans = _spans(pages, after, limit)
    if not spans:
        return None
    # Each page's range counted (one index range read in all): the run is the pages up to the first whose
    # range holds anything but its own typed reads (a change between two pages ends a run).
    ends = [end for _, end, _, _ in spans]
    counts = conn.execute(sql.SQL(
        "SELECT c.n, c.typed FROM unnest(%s::bigint[], %s::integer[], %s::bigint[], %s::integer[], %s::text[]) "
        "WITH ORDINALITY AS r(lo_lsn, lo_idx, hi_lsn, hi_idx, bid, i), LATERAL (SELECT count(*) AS n, "
        "count(*) FILTER (WHERE tup IS NOT NULL AND backfill_id = r.bid) AS typed FROM {s}.change_log "
        "WHERE (commit_lsn, commit_idx) > (r.lo_lsn, r.lo_idx) AND (commit_lsn, commit_idx) <= (r.hi_lsn, r.hi_idx)) c "
        "ORDER BY r.i").format(s=s),
        ([e[0] for e in [after, *ends[:-1]]], [e[1] for e in [after, *ends[:-1]]], [e[0] for e in ends],
         [e[1] for e in ends], [bid for bid, _, _, _ in spans])).fetchall()
    taken = 0
    for (_, _, reads, _), (n, typed) in zip(spans, counts, strict=True):
        if (int(n), int(typed)) != (reads, reads):
            break
        taken += 1
    span = spans[:taken]
    if not span or not sum(n for _, _, n, _ in span):
        return None
    count, end, bids = sum(n for _, _, n, _ in span), span[-1][1], sorted({bid for bid, _, _, _ in span})
    last = conn.execute(sql.SQL(
        "SELECT commit_lsn, commit_idx, commit_ts FROM {s}.change_log WHERE (commit_lsn, commit_idx) <= (%s, %s) "
        "ORDER BY commit_lsn DESC, commit_idx DESC LIMIT 1").format(s=s), end).fetchone()
    assert last is not None  # the range holds `count` rows
    by_bid = shapes(conn, schema, sorted(bids))
    numbers: dict[Columns, int] = {}
    shape_of = {bid: numbers.setdefault(cols, len(numbers)) for bid, cols in by_bid.items()}
    tables_of = {bid: table for bid, _, _, table in span}
    return TypedRun(True, count, (int(last[0]), int(last[1])), last[2], tuple(numbers), shape_of,
                    tuple(sorted(set(tables_of.values()))))


def _spans(pages: Sequence[tuple[Any, ...]], after: Position, limit: int
           ) -> list[tuple[str, Position, int, tuple[str, str]]]:
    """(backfill, last position, reads, table) of each page's share of a run after ``after`` of at most
    ``limit`` reads: a page's reads are counted from its figures, so a page with empty positions (dropped
    reads) is cut nowhere but at its ends."""
    out: list[tuple[str, Position, int, tuple[str, str]]] = []
    count = 0
    for bid, lsn, idx, rows, dropped, schema_name, table in pages:
        lsn, idx, rows, dropped = int(lsn), int(idx), int(rows), int(dropped or 0)
        first = max(idx, after[1] + 1) if lsn == after[0] else idx
        if first > idx and dropped:
            break  # the offset inside a page with empty positions: its reads left are not known
        reads, last_idx = (rows - dropped if first == idx else idx + rows - first), idx + rows - 1
        if count + reads > limit:
            if dropped:
                break
            reads, last_idx = limit - count, first + limit - count - 1
        if reads <= 0:
            break
        count += reads
        out.append((str(bid), (lsn, last_idx), reads, (str(schema_name), str(table))))
        if count >= limit:
            break
    return out


class RunRows:
    """A typed run's rows as the sink asks for them, each a COPY of the log (text format) read a block at a
    time: ``staged()`` rows ``seq, table_schema, table_name, shape, tup`` (``seq`` from 0 in log order);
    ``composite()`` only each read's composite text, one line each. Only rows of the run are sent (bounded by
    its last position, typed, of a backfill with a shape): whoever writes them checks the count. A COPY that
    is left early is read to its end, so the other can follow on the same connection."""

    def __init__(self, conn: psycopg.Connection, where: sql.Composable, args: Sequence[object]) -> None:
        self._conn, self._where, self._args = conn, where, args

    def staged(self) -> AbstractContextManager[Iterator[bytes]]:
        return self._copy(sql.SQL("(row_number() OVER (ORDER BY commit_lsn, commit_idx) - 1)::integer, table_schema, "
                                  "table_name, (%s::integer[])[array_position(%s::text[], backfill_id)], tup"),
                          self._args[:2])

    def composite(self) -> AbstractContextManager[Iterator[bytes]]:
        return self._copy(sql.SQL("tup"), ())

    @contextmanager
    def _copy(self, columns: sql.Composable, params: Sequence[object]) -> Iterator[Iterator[bytes]]:
        query = sql.SQL("COPY (SELECT {} {}) TO STDOUT").format(columns, self._where)
        with ExitStack() as stack:
            try:  # started inside the sink's transaction: an error of the state database's is told apart
                scan_in_log_order(self._conn)
                copy = stack.enter_context(self._conn.cursor().copy(query, (*params, *self._args[2:])))
            except psycopg.Error as exc:
                raise StateError(f"relaying typed reads from the log: {type(exc).__name__}") from exc
            rows = _blocks(copy)
            try:
                yield rows
            finally:
                for _ in rows:  # a writer that stopped early: the COPY must still be read to its end
                    pass


@contextmanager
def relay_rows(conn: psycopg.Connection, schema: str, routing: sql.Composable, params: Sequence[object],
               after: Position, run: TypedRun) -> Iterator[RunRows]:
    """The typed run's rows, relayed from the log as the sink asks (``RunRows``)."""
    assert run.typed and run.shape_of is not None
    bids = list(run.shape_of)
    where = sql.SQL("{where}AND (commit_lsn, commit_idx) <= (%s, %s) AND tup IS NOT NULL AND backfill_id = ANY(%s) "
                    "ORDER BY commit_lsn, commit_idx LIMIT %s").format(where=_where(sql.Identifier(schema), routing))
    yield RunRows(conn, where, ([run.shape_of[b] for b in bids], bids, *after, *params, *run.last, bids, run.count))


def _blocks(copy: psycopg.Copy) -> Iterator[bytes]:
    """COPY TO data (one row per chunk) joined into blocks of about RELAY_BLOCK bytes."""
    block: list[bytes] = []
    size = 0
    try:
        for data in copy:
            chunk = bytes(data)
            block.append(chunk)
            size += len(chunk)
            if size >= RELAY_BLOCK:
                yield b"".join(block)
                block, size = [], 0
    except psycopg.Error as exc:
        raise StateError(f"relaying typed reads from the log: {type(exc).__name__}") from exc
    if block:
        yield b"".join(block)
