"""A backfill runner's page loop: where reading resumes, the gate before each page (stop, pause, cancel,
flow control), one page read and staged between its watermarks, and the wait for the drain to reconcile
the last pages (see backfill/engine.py for the whole protocol)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from cdc_pipeline.backfill.flow import Flow
from cdc_pipeline.backfill.page_size import PageSizeOptimizer
from cdc_pipeline.backfill.progress import Progress
from cdc_pipeline.backfill.reader import PageReader, emit
from cdc_pipeline.backfill.watermark import Watermark, page_token
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import standby
from cdc_pipeline.state.backfills import BackfillStore

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05
Report = Callable[..., None]  # (state, progress, started, status, note="", force=False)


@dataclass
class _ReadPoint:
    """Where a runner's reading stands: the next page, its cursor, whether pages are left, the page size."""

    page: int
    cursor: list[str] | None
    reading: bool
    optimizer: PageSizeOptimizer


@dataclass
class PageLoop:
    """One runner's pages of one backfill, in one pair of sessions."""

    config: PipelineConfig
    store: BackfillStore
    flow: Flow
    stop: threading.Event
    report: Report
    max_query_ms: int

    def run(self, src: psycopg.Connection, state: psycopg.Connection, primary: psycopg.Connection | None,
            reader: PageReader, progress: Progress, started: float) -> None:
        """Read, stage and seal pages until the last one, then wait for the drain to reconcile them (unless
        stopped or cancelled)."""
        bid = progress.backfill_id
        key = self.store.mac_key(state, bid)
        primary = primary or src
        at = self._resume_point(state, primary, bid, key, progress)
        while at.reading:
            gate = self._gate(src, state, progress, started)
            if gate == "stop":
                break
            if gate == "wait":
                continue
            if not self._read_page(src, state, primary, reader, key, at, progress):
                break
            self.report(state, progress, started, "running" if at.reading else "completing")
        if progress.status not in ("interrupted", "cancelled"):
            self._await_completion(src, state, progress, started)

    def _resume_point(self, state: psycopg.Connection, primary: psycopg.Connection, bid: str, key: str | None,
                      progress: Progress) -> _ReadPoint:
        """Where reading goes on: after the last staged page whose rows are still there, with every staged
        page's high watermark sent again (see the module docstring)."""
        cfg = self.config.backfill
        pages = self.store.pages(state, bid)
        lost = self.flow.pages.first_lost(state, bid)
        if lost is not None:
            log.warning("backfill %s: the staged rows of pages %s-%s are gone (the state database crashed?): "
                        "reading them again", bid, lost, pages[-1]["page_no"])
            self.flow.pages.discard_from(state, bid, lost)
            pages = [p for p in pages if p["page_no"] < lost]
        for page in pages:
            if page["status"] == "staged":
                emit(primary, Watermark(bid, page["page_no"], "high", token=page_token(page["snapshot"], page["read_at"])),
                     key)
        last = pages[-1] if pages else None
        at = _ReadPoint(
            page=last["page_no"] + 1 if last else 0,
            cursor=list(last["cursor"]) if last and last["cursor"] is not None else None,
            reading=not (last and last["last"]),
            optimizer=PageSizeOptimizer(max_query_ms=self.max_query_ms, maximum=cfg.max_page_size, initial=min(
                next((int(p["page_size"]) for p in reversed(pages)), cfg.initial_page_size), cfg.max_page_size)))
        progress.resumed_from_page = at.page if progress.resumed else 0
        progress.pages_staged = len(pages)
        progress.rows_staged = sum(int(p["rows"]) for p in pages)
        progress.page_size = at.optimizer.size
        if progress.resumed:
            log.info("backfill %s: resuming at page %s, cursor %s", bid, at.page, at.cursor)
        return at

    def _gate(self, src: psycopg.Connection, state: psycopg.Connection, progress: Progress, started: float) -> str:
        """Before a page: "stop" (stopped, cancelled), "wait" (paused, or flow control holds reading), "go"."""
        bid = progress.backfill_id
        if self.stop.is_set():
            progress.status = "interrupted"
            return "stop"
        status = self.store.status(state, bid)
        if status == "cancelled":
            progress.status = "cancelled"
            return "stop"
        staged = self.flow.staged(state, bid)
        progress.drain_warning = self.flow.drain.update(src, state, staged)
        if status == "paused":
            self.report(state, progress, started, "paused", "paused: `cdc-pipeline backfill resume " + bid + "`")
            time.sleep(0.5)
            return "wait"
        wait = self.flow.must_wait(state, bid, staged)
        if wait:
            self.report(state, progress, started, "waiting", wait)
            time.sleep(POLL_SECONDS)
            return "wait"
        return "go"

    def _read_page(self, src: psycopg.Connection, state: psycopg.Connection, primary: psycopg.Connection,
                   reader: PageReader, key: str | None, at: _ReadPoint, progress: Progress) -> bool:
        """Read and stage the page at ``at`` between its watermarks and move ``at`` past it; False when
        stopped while a standby caught up."""
        bid = progress.backfill_id
        self.flow.pages.count_attempt(state, bid)
        progress.page_attempts_this_run += 1
        emit(primary, Watermark(bid, at.page, "low"), key)
        # On a standby, the page's snapshot must see everything the stream places before the low watermark.
        if primary is not src and not standby.wait_replayed(src, primary, self.stop):
            progress.status = "interrupted"
            return False
        while True:
            size = at.optimizer.size
            try:
                page = reader.read_and_stage(src, state, bid, at.page, at.cursor, size)
                break
            except psycopg.errors.QueryCanceled:
                progress.timeouts += 1
                at.optimizer = at.optimizer.observe_timeout(size)
                log.info("backfill %s page %s: select of %s rows exceeded %s ms; next try %s rows",
                         bid, at.page, size, self.max_query_ms, at.optimizer.size)
        emit(primary, Watermark(bid, at.page, "high", token=page.token), key)
        at.optimizer = at.optimizer.observe(size, page.read_ms, page.rows)
        progress.pages_staged += 1
        progress.rows_staged += page.rows
        progress.rows_read_this_run += page.rows
        self.flow.backlog_estimate += page.rows
        progress.page_size = at.optimizer.size
        if page.cursor is not None:
            at.cursor = page.cursor
        progress.cursor = at.cursor
        at.reading = page.rows >= size
        at.page += 1
        return True

    def _await_completion(self, src: psycopg.Connection, state: psycopg.Connection, progress: Progress,
                          started: float) -> None:
        """The last page is staged: wait for the drain to reconcile everything."""
        bid = progress.backfill_id
        while True:
            status = self.store.status(state, bid)
            if status in ("completed", "cancelled"):
                progress.status = status
                return
            if self.stop.is_set():
                progress.status = "interrupted"
                return
            progress.drain_warning = self.flow.watch_drain(src, state, bid)
            self.report(state, progress, started, "completing", "waiting for the drain to reconcile the last pages")
            time.sleep(POLL_SECONDS)
