"""State SQL of watermark reconciliation (the decisions are capture/reconcile.py's): low watermarks, a
staged page and its backfill's key and shape, the set-wise insert of a page's reads into the change log,
and the page's checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from cdc_pipeline.postgres.compose import execute
from cdc_pipeline.state.base import Position, SchemaStore


@dataclass(frozen=True)
class PageShape:
    table_schema: str
    table_name: str
    primary_key: tuple[str, ...]


@dataclass(frozen=True)
class StagedPage:
    snapshot: str
    read_at: datetime
    rows: int
    cursor: list[str] | None
    last: bool
    status: str  # the backfill's
    low: Position | None  # the page's low watermark, when the drain saw it
    # Whether its rows are in the (unlogged) staging table, which a crash empties, and every earlier page of
    # the backfill is reconciled (pages are reconciled in order: a later one would checkpoint past a lost one).
    in_order: bool = True


class ReconcileStore(SchemaStore):
    def low_watermark(self, conn: psycopg.Connection, backfill_id: str, page: int, at: Position) -> None:
        """Remember a page's low watermark position (the first one wins if a page is re-read)."""
        execute(conn, sql.SQL(
            "INSERT INTO {}.backfill_low_watermarks (backfill_id, page_no, commit_lsn, commit_idx) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING").format(self.s),
            (backfill_id, page, at[0], at[1]))

    def mac_key(self, conn: psycopg.Connection, backfill_id: str) -> str | None:
        row = execute(conn, sql.SQL("SELECT mac_key FROM {}.backfills WHERE id = %s").format(self.s),
                      (backfill_id,)).fetchone()
        return str(row[0]) if row else None

    def shape(self, conn: psycopg.Connection, backfill_id: str) -> PageShape | None:
        row = execute(conn, sql.SQL("SELECT table_schema, table_name, primary_key FROM {}.backfills WHERE id = %s")
                      .format(self.s), (backfill_id,)).fetchone()
        return PageShape(row[0], row[1], tuple(row[2])) if row else None

    def staged_page(self, conn: psycopg.Connection, backfill_id: str, page: int) -> StagedPage | None:
        """The page while it waits for its high watermark (None: reconciled already, or unknown), locked until
        the end of the transaction: a runner that finds its rows gone and reads it again waits for this one."""
        row = execute(conn, sql.SQL(
            "SELECT p.snapshot, p.read_at, p.rows, p.cursor, p.last, b.status, w.commit_lsn, w.commit_idx, "
            "(p.rows = 0 OR EXISTS (SELECT 1 FROM {s}.backfill_rows r WHERE r.backfill_id = p.backfill_id "
            "AND r.page_no = p.page_no)) AND NOT EXISTS (SELECT 1 FROM {s}.backfill_pages e "
            "WHERE e.backfill_id = p.backfill_id AND e.page_no < p.page_no AND e.status = 'staged') "
            "FROM {s}.backfill_pages p JOIN {s}.backfills b ON b.id = p.backfill_id "
            "LEFT JOIN {s}.backfill_low_watermarks w ON w.backfill_id = p.backfill_id AND w.page_no = p.page_no "
            "WHERE p.backfill_id = %s AND p.page_no = %s AND p.status = 'staged' FOR UPDATE OF p").format(s=self.s),
            (backfill_id, page)).fetchone()
        if row is None:
            return None
        snap_text, read_at, rows, cursor, last, status, low_lsn, low_idx, in_order = row
        low = None if low_lsn is None else (int(low_lsn), int(low_idx))
        return StagedPage(snap_text, read_at, int(rows), cursor, bool(last), status, low, bool(in_order))

    def checkpoint(self, conn: psycopg.Connection, backfill_id: str, page: int, staged: StagedPage,
                   dropped: int, high: Position) -> None:
        """The page is reconciled: its figures, and the backfill's cursor (completed after its last page)."""
        execute(conn, sql.SQL(
            "UPDATE {}.backfill_pages SET status = 'reconciled', dropped = %s, high_lsn = %s, high_idx = %s, "
            "reconciled_at = now() WHERE backfill_id = %s AND page_no = %s").format(self.s),
            (dropped, high[0], high[1], backfill_id, page))
        execute(conn, sql.SQL(
            "UPDATE {}.backfills SET cursor = coalesce(%s, cursor), pages = pages + 1, rows_read = rows_read + %s, "
            "rows_dropped = rows_dropped + %s, checkpoint_at = now(), updated_at = now(), "
            "status = CASE WHEN %s THEN 'completed' ELSE status END, "
            "finished_at = CASE WHEN %s THEN now() ELSE finished_at END WHERE id = %s").format(self.s),
            (staged.cursor, staged.rows, dropped, staged.last, staged.last, backfill_id))

    def insert_reads(self, conn: psycopg.Connection, shape: PageShape, backfill_id: str, page: int,
                     high: Position, low: Position, exact: list[int], ranges: list[tuple[int, int]],
                     read_at: object) -> int:
        """Log the page's staged rows as reads at `high`, minus every row a change between `low` and
        `high`, or of a transaction the snapshot could not see (`exact` xids, `ranges`), touched (or a
        truncate). Row ``seq`` (1, 2, ...) takes commit_idx ``high[1] + seq - 1``: a dropped row leaves its
        position empty, and no sort is needed. The staged rows are deleted by the same statement (the log
        holds them now; the backfill runner no longer deletes them page by page). Returns how many were
        logged."""
        unseen: list[sql.Composable] = []
        params: dict[str, object] = {
            "schema": shape.table_schema, "table": shape.table_name, "low_lsn": low[0], "low_idx": low[1],
            "lsn": high[0], "idx": high[1], "exact": exact, "pk": list(shape.primary_key),
            "id": backfill_id, "page": page, "read_at": read_at,
        }
        if exact:
            unseen.append(sql.SQL("c.xid = ANY(%(exact)s::bigint[])"))
        for i, (lo, hi) in enumerate(ranges):
            params[f"lo{i}"], params[f"hi{i}"] = lo, hi
            unseen.append(sql.SQL(f"(c.xid >= %(lo{i})s AND c.xid < %(hi{i})s)"))
        unseen_sql = sql.SQL(" OR ").join(unseen) if unseen else sql.SQL("false")
        # Key names go in as parameters: a composed literal holding '%' would break the placeholders.
        for i, k in enumerate(shape.primary_key):
            params[f"key{i}"] = k
        old_pk = sql.SQL("jsonb_build_array({})::text").format(sql.SQL(", ").join(
            sql.SQL(f"(t.record || t.changes) -> %(key{i})s::text") for i in range(len(shape.primary_key))))
        query = sql.SQL(
            "WITH touched AS ("
            "  SELECT c.action, c.pk, c.record, c.changes FROM {s}.change_log c"
            "  WHERE (c.commit_lsn, c.commit_idx) > (%(low_lsn)s, %(low_idx)s)"
            "    AND (c.commit_lsn, c.commit_idx) < (%(lsn)s, %(idx)s)"
            "    AND c.table_schema = %(schema)s AND c.table_name = %(table)s AND c.action <> 'read'"
            "  UNION ALL"
            "  SELECT c.action, c.pk, c.record, c.changes FROM {s}.change_log c"
            "  WHERE ({unseen}) AND (c.commit_lsn, c.commit_idx) <= (%(low_lsn)s, %(low_idx)s)"
            "    AND c.table_schema = %(schema)s AND c.table_name = %(table)s AND c.action <> 'read'"
            "), stale AS ("
            "  SELECT t.pk FROM touched t WHERE t.pk IS NOT NULL"
            "  UNION"
            "  SELECT {old_pk} FROM touched t WHERE t.action = 'update' AND t.changes ?| %(pk)s::text[]"
            "), page AS ("
            "  DELETE FROM {s}.backfill_rows r WHERE r.backfill_id = %(id)s AND r.page_no = %(page)s"
            "  RETURNING r.seq, r.pk, r.record, r.tup, r.texts"
            ") INSERT INTO {s}.change_log (commit_lsn, commit_idx, xid, table_schema, table_name, action, pk, record,"
            "    changes, commit_ts, backfill_id, tup, texts)"
            "  SELECT %(lsn)s, %(idx)s + r.seq - 1, NULL, %(schema)s, %(table)s, 'read',"
            "    r.pk, r.record, NULL, %(read_at)s, %(id)s, r.tup, r.texts"
            "  FROM page r"
            "  WHERE NOT EXISTS (SELECT 1 FROM touched t WHERE t.action = 'truncate')"
            "    AND NOT EXISTS (SELECT 1 FROM stale x WHERE x.pk = r.pk)"
        ).format(s=self.s, unseen=unseen_sql, old_pk=old_pk)
        # The command's own row count: RETURNING would keep every inserted row in a tuplestore to count them.
        return max(0, execute(conn, query, params).rowcount)

