"""Watermark reconciliation: the drain hook that turns a backfill's staged page into `read` messages.

Called by the drain for logical messages with prefix ``WATERMARK_PREFIX`` (backfill/watermark.py),
inside the drain's open state transaction, with every change before the message already in the log:

* low watermark: remember its log position for the page (the first one wins if a page is re-read);
* high watermark: drop every staged row of the page for which the log holds a change of the same
  primary key (or, for an update that changed the key, the same old key), or a truncate of the table,
  that is either between the two watermarks, or from a transaction the page's snapshot could not see
  (committed before the low watermark but not yet visible when the snapshot was taken: the commit
  record is written before the transaction leaves the proc array). Insert the rest at the high
  watermark's position (the page's staged rows deleted by the same statement), and checkpoint the backfill,
  all in the drain's transaction: a drain crash
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
from typing import TYPE_CHECKING

import psycopg

from cdc_pipeline.backfill import watermark
from cdc_pipeline.backfill.watermark import WATERMARK_PREFIX, Snapshot, page_token
from cdc_pipeline.state.reconciliation import PageShape, ReconcileStore

if TYPE_CHECKING:
    from cdc_pipeline.config import PipelineConfig
    from cdc_pipeline.postgres.pgoutput import LogicalMessage

log = logging.getLogger(__name__)


class Reconciler:
    """The drain hook for backfill watermarks (see the module docstring)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.store = ReconcileStore(schema)
        self._shapes: dict[str, PageShape] = {}
        self.pages_reconciled = 0
        self.refused = 0  # messages under the prefix that were not an authenticated watermark of ours

    def __call__(self, message: LogicalMessage, commit_lsn: int, commit_idx: int, conn: psycopg.Connection) -> tuple[int, int]:
        # Until it is authenticated the content is the application's: logged by position and length only.
        where = (message.lsn >> 32, message.lsn & 0xFFFFFFFF, len(message.content))
        mark = watermark.decode(message.content)
        if mark is None:
            self.refused += 1
            log.warning("ignoring a malformed backfill watermark at %X/%X (%d bytes)", *where)
            return 0, 0
        if not message.transactional:
            # Ours are always transactional; a non-transactional one has no place in the log's order.
            self.refused += 1
            log.warning("ignoring a non-transactional backfill watermark at %X/%X (%d bytes)", *where)
            return 0, 0
        key = self.store.mac_key(conn, mark.backfill_id)
        if key is None or not watermark.verify(message.content, mark, key):
            # Any role that can log in to the source may emit a message with our prefix: only one signed
            # with the backfill's key (kept in the state database) is acted on.
            self.refused += 1
            log.warning("ignoring an unauthenticated backfill watermark at %X/%X (%d bytes)", *where)
            return 0, 0
        if mark.kind == "low":
            self.store.low_watermark(conn, mark.backfill_id, mark.page, (commit_lsn, commit_idx))
            return 0, 0
        return self._reconcile(mark, commit_lsn, commit_idx, conn)

    def _shape(self, conn: psycopg.Connection, backfill_id: str) -> PageShape | None:
        shape = self._shapes.get(backfill_id)
        if shape is None:
            shape = self.store.shape(conn, backfill_id)
            if shape is None:
                return None
            self._shapes[backfill_id] = shape
        return shape

    def _reconcile(self, mark: watermark.Watermark, lsn: int, idx: int, conn: psycopg.Connection
                   ) -> tuple[int, int]:
        page = self.store.staged_page(conn, mark.backfill_id, mark.page)
        if page is None:
            return 0, 0  # already reconciled (a re-sent high watermark), cancelled, or unknown
        if page.status not in ("running", "paused"):
            return 0, 0
        if mark.token is not None and mark.token != page_token(page.snapshot, page.read_at):
            return 0, 0  # it sealed an earlier staging of this page that was lost; the page was read again
        if not page.in_order:
            # The staging table is unlogged: a crash of the state database emptied it. Reconciling would drop
            # every row of the page (or, for a later page, checkpoint past it); it stays staged, and the
            # backfill reads it again when it runs next.
            log.warning("backfill %s page %s: its staged rows, or an earlier page's, are gone (the state database "
                        "crashed?): not reconciled; read again when the backfill resumes", mark.backfill_id, mark.page)
            return 0, 0
        shape = self._shape(conn, mark.backfill_id)
        if shape is None:
            return 0, 0
        low = page.low
        if low is None:
            # Cannot happen while the drain reads every message in order; if it does, treat the whole
            # log before the high watermark as the window: more reads dropped, never a stale one.
            log.warning("backfill %s page %s: no low watermark seen; reconciling conservatively",
                        mark.backfill_id, mark.page)
            low = (0, -1)
        snapshot = Snapshot.parse(page.snapshot)
        exact, ranges = snapshot.unseen(mark.xid if mark.xid is not None else snapshot.xmax)
        inserted = self.store.insert_reads(conn, shape, mark.backfill_id, mark.page, (lsn, idx), low, exact,
                                           ranges, page.read_at)
        dropped = page.rows - inserted
        self.store.checkpoint(conn, mark.backfill_id, mark.page, page, dropped, (lsn, idx))
        self.pages_reconciled += 1
        if page.last:
            self._shapes.pop(mark.backfill_id, None)
        return page.rows, inserted  # a page's rows take its seq positions, dropped or not


def watermark_hooks(config: PipelineConfig) -> dict[str, Reconciler]:
    """The drain's default message hooks: backfill reconciliation."""
    return {WATERMARK_PREFIX: Reconciler(config.state.schema_name)}
