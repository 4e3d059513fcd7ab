"""State SQL of a running backfill's pages: staging records, read-side counters, flow-control figures, and
staged rows found lost (the backfills themselves: state/backfills.py)."""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg import sql

from cdc_pipeline.state.base import Position, SchemaStore


class PageStore(SchemaStore):
    def rows_table(self) -> sql.Composed:
        """The staged-rows table and its columns, as COPY and INSERT ... SELECT name them."""
        return sql.SQL("{}.backfill_rows (backfill_id, page_no, seq, pk, record, tup, texts, cursor)").format(self.s)

    def record_page(self, conn: psycopg.Connection, bid: str, page_no: int, snapshot: str, read_at: datetime,
                    size: int, rows: int, read_ms: float, cursor: list[str] | None) -> None:
        """A page staged: its snapshot, cursor and size (a short page is the last), and the reader's counters."""
        conn.execute(sql.SQL(
            "INSERT INTO {}.backfill_pages (backfill_id, page_no, snapshot, read_at, page_size, rows, read_ms, "
            "cursor, last) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)").format(self.s),
            (bid, page_no, snapshot, read_at, size, rows, read_ms, cursor, rows < size))
        conn.execute(sql.SQL("UPDATE {}.backfill_readers SET rows_fetched = rows_fetched + %s, page_size = %s, "
                             "updated_at = now() WHERE backfill_id = %s").format(self.s), (rows, size, bid))

    def count_attempt(self, conn: psycopg.Connection, bid: str) -> None:
        conn.execute(sql.SQL("UPDATE {}.backfill_readers SET page_attempts = page_attempts + 1, updated_at = now() "
                             "WHERE backfill_id = %s").format(self.s), (bid,))

    def set_estimate(self, conn: psycopg.Connection, bid: str, rows: int | None) -> None:
        conn.execute(sql.SQL("UPDATE {}.backfills SET estimated_rows = %s WHERE id = %s").format(self.s), (rows, bid))

    def staged(self, conn: psycopg.Connection, bid: str) -> int:
        """Pages staged and not yet reconciled by the drain."""
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.backfill_pages WHERE backfill_id = %s "
                                   "AND status = 'staged'").format(self.s), (bid,)).fetchone()
        return int(row[0]) if row else 0

    def backlog_share(self, conn: psycopg.Connection, bid: str, offset: Position) -> tuple[int, int]:
        """(rows staged, rows reconciled after a sink's offset): this backfill's share of its backlog."""
        row = conn.execute(sql.SQL(
            "SELECT coalesce(sum(rows) FILTER (WHERE status = 'staged'), 0), coalesce(sum(rows - dropped) "
            "FILTER (WHERE status = 'reconciled' AND (high_lsn, high_idx) > (%s, %s)), 0) "
            "FROM {}.backfill_pages WHERE backfill_id = %s").format(self.s), (offset[0], offset[1], bid)).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def first_lost(self, conn: psycopg.Connection, bid: str) -> int | None:
        """The first staged page whose rows are gone from the (unlogged) staging table, which a crash of the
        state database empties: None when every staged page still has its rows."""
        row = conn.execute(sql.SQL(
            "SELECT min(p.page_no) FROM {s}.backfill_pages p WHERE p.backfill_id = %s AND p.status = 'staged' "
            "AND p.rows > 0 AND NOT EXISTS (SELECT 1 FROM {s}.backfill_rows r WHERE r.backfill_id = p.backfill_id "
            "AND r.page_no = p.page_no)").format(s=self.s), (bid,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def discard_from(self, conn: psycopg.Connection, bid: str, page_no: int) -> None:
        """Forget the staged pages from ``page_no`` on (to be read again, under the same numbers). Their row locks
        wait for a drain reconciling one of them; their low watermarks stay (the first one seen wins: a
        wider window drops more reads, never lets a stale one through)."""
        with conn.transaction():
            conn.execute(sql.SQL("DELETE FROM {}.backfill_pages WHERE backfill_id = %s AND page_no >= %s "
                                 "AND status = 'staged'").format(self.s), (bid, page_no))
            conn.execute(sql.SQL("DELETE FROM {}.backfill_rows WHERE backfill_id = %s AND page_no >= %s")
                         .format(self.s), (bid, page_no))
