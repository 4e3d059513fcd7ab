"""Watermark reconciliation: the drain hook that turns a backfill's staged page into `read` messages.

Called by the drain for logical messages with prefix ``WATERMARK_PREFIX`` (backfill/watermark.py),
inside the drain's open state transaction, with every change before the message already in the log:

* low watermark: remember its log position for the page (the first one wins if a page is re-read);
* high watermark: drop every staged row of the page for which the log holds a change of the same
  primary key (or, for an update that changed the key, the same old key), or a truncate of the table,
  that is either between the two watermarks, or from a transaction the page's snapshot could not see
  (committed before the low watermark but not yet visible when the snapshot was taken: the commit
  record is written before the transaction leaves the proc array). Insert the rest at the high
  watermark's position, and checkpoint the backfill, all in the drain's transaction: a drain crash
  replays the whole thing, and a page is reconciled once (a second high watermark for it is a no-op).

Only authenticated watermarks count: any role that can log in to the source may emit a message with the
prefix, so each carries an HMAC of its fields under the backfill's own key (``backfills.mac_key``, kept in
the state database), and a non-transactional one is ignored (ours never are).

Why this gives no stale reads: a read enters the log at its high watermark. Every change the read
does not reflect either comes after the high watermark in the log (fine: it is delivered after the
read) or is one of the changes above (the read is dropped; the change represents the row). The
transactions the snapshot could not see are found through the log's xid index, as the snapshot's
in-progress list plus the xids from its xmax up to an xid assigned after it (the high watermark's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from cdc_pipeline.backfill import watermark
from cdc_pipeline.backfill.watermark import WATERMARK_PREFIX, Snapshot, page_token
from cdc_pipeline.postgres.compose import execute

if TYPE_CHECKING:
    from cdc_pipeline.config import PipelineConfig
    from cdc_pipeline.postgres.pgoutput import LogicalMessage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Shape:
    table_schema: str
    table_name: str
    primary_key: tuple[str, ...]


class Reconciler:
    """The drain hook for backfill watermarks (see the module docstring)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.s = sql.Identifier(schema)
        self._shapes: dict[str, _Shape] = {}
        self.pages_reconciled = 0

    def __call__(self, message: LogicalMessage, commit_lsn: int, commit_idx: int, conn: psycopg.Connection) -> int:
        mark = watermark.decode(message.content)
        if mark is None:
            log.warning("ignoring a malformed backfill watermark: %r", bytes(message.content)[:200])
            return 0
        if not message.transactional:
            # Ours are always transactional; a non-transactional one has no place in the log's order.
            log.warning("ignoring a non-transactional backfill watermark (backfill %s page %s)",
                        mark.backfill_id, mark.page)
            return 0
        key = self._key(conn, mark.backfill_id)
        if key is None or not watermark.verify(message.content, mark, key):
            # Any role that can log in to the source may emit a message with our prefix: only one signed
            # with the backfill's key (kept in the state database) is acted on.
            log.warning("ignoring an unauthenticated backfill watermark (backfill %r page %s)",
                        mark.backfill_id[:80], mark.page)
            return 0
        if mark.kind == "low":
            execute(conn, sql.SQL(
                "INSERT INTO {}.backfill_low_watermarks (backfill_id, page_no, commit_lsn, commit_idx) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING").format(self.s),
                (mark.backfill_id, mark.page, commit_lsn, commit_idx))
            return 0
        return self._reconcile(mark, commit_lsn, commit_idx, conn)

    def _key(self, conn: psycopg.Connection, backfill_id: str) -> str | None:
        row = execute(conn, sql.SQL("SELECT mac_key FROM {}.backfills WHERE id = %s").format(self.s),
                      (backfill_id,)).fetchone()
        return str(row[0]) if row else None

    def _shape(self, conn: psycopg.Connection, backfill_id: str) -> _Shape | None:
        shape = self._shapes.get(backfill_id)
        if shape is None:
            row = execute(conn, sql.SQL("SELECT table_schema, table_name, primary_key FROM {}.backfills WHERE id = %s")
                               .format(self.s), (backfill_id,)).fetchone()
            if row is None:
                return None
            shape = self._shapes[backfill_id] = _Shape(row[0], row[1], tuple(row[2]))
        return shape

    def _reconcile(self, mark: watermark.Watermark, lsn: int, idx: int, conn: psycopg.Connection) -> int:
        row = execute(conn, sql.SQL(
            "SELECT p.snapshot, p.read_at, p.rows, p.cursor, p.last, b.status, w.commit_lsn, w.commit_idx "
            "FROM {s}.backfill_pages p JOIN {s}.backfills b ON b.id = p.backfill_id "
            "LEFT JOIN {s}.backfill_low_watermarks w ON w.backfill_id = p.backfill_id AND w.page_no = p.page_no "
            "WHERE p.backfill_id = %s AND p.page_no = %s AND p.status = 'staged'").format(s=self.s),
            (mark.backfill_id, mark.page)).fetchone()
        if row is None:
            return 0  # already reconciled (a re-sent high watermark), cancelled, or unknown
        snap_text, read_at, rows, cursor, last, status, low_lsn, low_idx = row
        if status not in ("running", "paused"):
            return 0
        if mark.token is not None and mark.token != page_token(snap_text, read_at):
            return 0  # it sealed an earlier staging of this page that was lost; the page was read again
        shape = self._shape(conn, mark.backfill_id)
        if shape is None:
            return 0
        if low_lsn is None:
            # Cannot happen while the drain reads every message in order; if it does, treat the whole
            # log before the high watermark as the window: more reads dropped, never a stale one.
            log.warning("backfill %s page %s: no low watermark seen; reconciling conservatively",
                        mark.backfill_id, mark.page)
            low_lsn, low_idx = 0, -1
        snapshot = Snapshot.parse(snap_text)
        exact, ranges = snapshot.unseen(mark.xid if mark.xid is not None else snapshot.xmax)
        inserted = self._insert_reads(conn, shape, mark, (lsn, idx), (int(low_lsn), int(low_idx)), exact, ranges,
                                      read_at)
        dropped = int(rows) - inserted
        execute(conn, sql.SQL(
            "UPDATE {}.backfill_pages SET status = 'reconciled', dropped = %s, high_lsn = %s, high_idx = %s, "
            "reconciled_at = now() WHERE backfill_id = %s AND page_no = %s").format(self.s),
            (dropped, lsn, idx, mark.backfill_id, mark.page))
        execute(conn, sql.SQL(
            "UPDATE {}.backfills SET cursor = coalesce(%s, cursor), pages = pages + 1, rows_read = rows_read + %s, "
            "rows_dropped = rows_dropped + %s, checkpoint_at = now(), updated_at = now(), "
            "status = CASE WHEN %s THEN 'completed' ELSE status END, "
            "finished_at = CASE WHEN %s THEN now() ELSE finished_at END WHERE id = %s").format(self.s),
            (cursor, rows, dropped, last, last, mark.backfill_id))
        self.pages_reconciled += 1
        if last:
            self._shapes.pop(mark.backfill_id, None)
        return inserted

    def _insert_reads(self, conn: psycopg.Connection, shape: _Shape, mark: watermark.Watermark,
                      high: tuple[int, int], low: tuple[int, int], exact: list[int],
                      ranges: list[tuple[int, int]], read_at: object) -> int:
        unseen: list[sql.Composable] = []
        params: dict[str, object] = {
            "schema": shape.table_schema, "table": shape.table_name, "low_lsn": low[0], "low_idx": low[1],
            "lsn": high[0], "idx": high[1], "exact": exact, "pk": list(shape.primary_key),
            "id": mark.backfill_id, "page": mark.page, "read_at": read_at,
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
            "), ins AS ("
            "  INSERT INTO {s}.change_log (commit_lsn, commit_idx, xid, table_schema, table_name, action, pk, record,"
            "    changes, commit_ts, backfill_id, tup)"
            "  SELECT %(lsn)s, %(idx)s + row_number() OVER (ORDER BY r.seq) - 1, NULL, %(schema)s, %(table)s, 'read',"
            "    r.pk, r.record, NULL, %(read_at)s, %(id)s, r.tup"
            "  FROM {s}.backfill_rows r"
            "  WHERE r.backfill_id = %(id)s AND r.page_no = %(page)s"
            "    AND NOT EXISTS (SELECT 1 FROM touched t WHERE t.action = 'truncate')"
            "    AND NOT EXISTS (SELECT 1 FROM stale x WHERE x.pk = r.pk)"
            "  RETURNING 1"
            ") SELECT count(*) FROM ins"
        ).format(s=self.s, unseen=unseen_sql, old_pk=old_pk)
        row = execute(conn, query, params).fetchone()
        return int(row[0]) if row else 0


def watermark_hooks(config: PipelineConfig) -> dict[str, Reconciler]:
    """The drain's default message hooks: backfill reconciliation."""
    return {WATERMARK_PREFIX: Reconciler(config.state.schema_name)}
