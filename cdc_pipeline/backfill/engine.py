"""The backfill runner: keyset pages between watermarks, staged for the drain to reconcile.

Per page (DBLog-style watermarks; backfill/reader.py): emit the low watermark, read the page in one
REPEATABLE READ transaction with its snapshot, stage the rows, emit the high watermark. The drain
reconciles the page when it reaches the high watermark (capture/reconcile.py) and checkpoints the
cursor in the same transaction.

Up to ``backfill.max_staged_pages`` pages wait for the drain at a time, and reading pauses while a
target sink's backlog exceeds ``backfill.max_sink_backlog`` (backfill/flow.py). While pages wait and no
process consumes the slot, every progress line says so and names the fix. Between pages the runner
follows the backfill's status (pause, resume, cancel). Resuming after a crash re-sends the high
watermark of every staged page (a page whose high watermark did get out is reconciled once; the re-sent
one is a no-op) and reads on from the last staged page: only a page that was being read is read again. Staged
rows are unlogged (no WAL, nothing for the walsender to decode): a crash of the state database empties them,
so resuming first finds the first staged page whose rows are gone and reads again from there (the drain
never reconciles a page without its rows; the first staging's high watermark no longer matches its token).

Rows whose sort column is NULL are not part of a partial backfill (they have no position in the
order); a full backfill orders by the primary key, which is never NULL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import psycopg

from cdc_pipeline.backfill.flow import Flow
from cdc_pipeline.backfill.page_loop import PageLoop
from cdc_pipeline.backfill.progress import Progress
from cdc_pipeline.backfill.reader import PageReader, page_sql
from cdc_pipeline.backfill.request import BackfillRequest, TableShape, resolve, table_shape
from cdc_pipeline.backfill.typed import typed_columns, wanted
from cdc_pipeline.config import PipelineConfig, redact
from cdc_pipeline.core.backoff import next_delay_ms
from cdc_pipeline.postgres import session
from cdc_pipeline.state.backfills import FINISHED, BackfillConflict, BackfillStore
from cdc_pipeline.state.typed_rows import ensure_row_type, record_shape

__all__ = ["Backfiller", "BackfillRequest", "Progress", "TableShape", "page_sql", "resolve"]

log = logging.getLogger(__name__)

APP_NAME = "cdc_pipeline.backfill"
# After a lost session, how long the runner lock may stay held (by our old session, until the server ends
# it: its keepalives take about 30 s) before another runner is assumed.
LOCK_WAIT_S = 90.0


class RunnerLockHeld(RuntimeError):
    """After a lost session, the backfill's runner lock is still held."""


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
        self.flow = Flow(config, self.spec, self.store)
        self.same_db = config.state_dsn == config.source.dsn
        self._primary: psycopg.Connection | None = None  # where watermarks are written (the source's primary)
        self._stop = threading.Event()
        self._last_report = 0.0
        self.progress: Progress | None = None

    def stop(self) -> None:
        """Stop between pages; the backfill stays active and resumes from its checkpoint next time."""
        self._stop.set()

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> Progress:
        """A lost session (the source or state database restarting, a network cut) is opened again after
        the drain's capped backoff (``drain.retry_initial_ms`` doubling up to ``drain.retry_max_ms``) and the
        backfill goes on from its checkpoint in this run; one the drain completed meanwhile, or while this
        process was failing, reports completed: the truth, not the failure."""
        started = time.monotonic()
        attempt = 0
        lock_wait_since: float | None = None
        while True:
            staged = self.progress.pages_staged if self.progress else -1
            try:
                return self._session(started)
            except Exception as exc:
                if isinstance(exc, RunnerLockHeld):
                    lock_wait_since = lock_wait_since or time.monotonic()
                    if time.monotonic() - lock_wait_since > LOCK_WAIT_S:
                        raise BackfillConflict(str(exc), alive=True) from exc
                elif self.progress is None:  # never got going (a wrong DSN, a server down): say so at once
                    raise
                elif not session.connection_lost(exc):
                    if self._finished_meanwhile(started):
                        return self.progress
                    raise
                progress = self.progress
                assert progress is not None
                if self._stop.is_set():
                    progress.status = "interrupted"
                    return progress
                attempt = 1 if progress.pages_staged > staged else attempt + 1
                retry = self.config.drain
                delay = next_delay_ms(attempt, retry.retry_initial_ms, retry.retry_max_ms) / 1000
                log.warning("backfill %s: lost its session (%s); retry %d in %.1f s, from its checkpoint",
                            progress.backfill_id,
                            redact(" ".join(f"{type(exc).__name__}: {exc}".split()))[:300], attempt, delay)
                if self._stop.wait(delay):
                    progress.status = "interrupted"
                    return progress

    def _session(self, started: float) -> Progress:
        """One go with one pair of sessions: the first claims the backfill, a later one takes it up again."""
        src = session.connect(self.config.source.dsn, autocommit=True, application_name=APP_NAME)
        state: psycopg.Connection | None = None
        self._primary = None
        try:
            # A standby as the source: watermarks are written on its primary, pages read on the standby.
            primary_dsn = self.config.source.primary_dsn
            self._primary = session.connect(primary_dsn, autocommit=True, application_name=APP_NAME) \
                if primary_dsn else None
            src.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            state = session.connect(self.config.state_dsn, autocommit=True, application_name=APP_NAME)
            shape = table_shape(src, self.spec, self.config.source.publication)
            reader = PageReader(self.config.state.schema_name, self.spec, shape, self.same_db, self.max_query_ms)
            warnings = []
            if not shape.sort_indexed and self.progress is None:
                warnings.append(f"sort column {self.spec.sort_column!r} of {self.spec.table} is not the first column "
                                f"of any index: every page scans the table; consider CREATE INDEX ON "
                                f"{self.spec.table} ({self.spec.sort_column})")
                log.warning(warnings[-1])
            reader.ensure_relation(src, state)
            progress = self.progress
            if progress is None:
                backfill_id, resumed = self._claim(state, shape)
                progress = self.progress = Progress(backfill_id, self.spec, "running", resumed=resumed,
                                                    warnings=warnings)
                if not resumed:
                    self.flow.pages.set_estimate(state, backfill_id, reader.estimate(src))
            elif not self._retake(state, progress, started):
                return progress  # finished while the session was lost
            reader = replace(reader, typed=self._typed_shape(src, state, progress.backfill_id, shape.generated))
            try:
                PageLoop(self.config, self.store, self.flow, self._stop, self._report, self.max_query_ms).run(
                    src, state, self._primary, reader, progress, started)
                self._finish(state, progress, started)
            except BaseException as exc:
                if not session.connection_lost(exc):  # a lost one is retried by run()
                    progress.status = "failed"
                    self._record_error(state, progress.backfill_id, f"{type(exc).__name__}: {exc}")
                raise
            return progress
        finally:
            src.close()
            if self._primary is not None:
                self._primary.close()
            if state is not None:
                state.close()  # releases the runner lock

    def _retake(self, state: psycopg.Connection, progress: Progress, started: float) -> bool:
        """After a lost session: the backfill's runner lock again (False when the drain finished it
        meanwhile: reported as it is)."""
        bid = progress.backfill_id
        status = self.store.status(state, bid)
        if status in FINISHED:
            log.warning("backfill %s: %s while this process reconnected", bid, status)
            progress.status = status
            self._finish(state, progress, started)
            return False
        if not self.store.lock(state, bid):  # our old session, until the server ends it; or another runner
            raise RunnerLockHeld(f"backfill {bid}: its runner lock is held by another session")
        log.info("backfill %s: session open again; going on from its checkpoint", bid)
        progress.resumed = True
        return True

    def _finished_meanwhile(self, started: float) -> bool:
        """On a failure: whether the drain completed (or someone cancelled) the backfill regardless."""
        assert self.progress is not None
        try:
            with session.connect(self.config.state_dsn, autocommit=True, application_name=APP_NAME) as state:
                status = self.store.status(state, self.progress.backfill_id)
                if status not in FINISHED:
                    return False
                log.warning("backfill %s: this process failed, but the backfill is %s", self.progress.backfill_id,
                            status)
                self.progress.status = status
                self._finish(state, self.progress, started)
                return True
        except psycopg.Error:  # the state database is what failed: nothing to tell
            return False

    def _claim(self, state: psycopg.Connection, shape: TableShape) -> tuple[str, bool]:
        waited = 0.0
        while True:
            try:
                return self.store.claim(state, self.spec, shape.primary_key, shape.keyset, self.request.origin, None,
                                        max_parallel=self.config.backfill.max_parallel)
            except BackfillConflict as exc:
                if not (self.wait_if_busy and exc.alive) or self._stop.is_set():
                    raise
                if waited == 0.0 or waited >= 30:
                    log.info("waiting: %s", exc)
                    waited = 0.0
                time.sleep(1.0)
                waited += 1.0

    def _typed_shape(self, src: psycopg.Connection, state: psycopg.Connection, backfill_id: str,
                     left_out: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
        """The backfill's typed shape when it reads typed rows (backfill/typed.py); a resumed backfill
        keeps the shape it started with (pages of another shape are read as JSON)."""
        if not wanted(self.config, self.spec.sinks):
            return None
        columns = typed_columns(src, self.spec.schema_name, self.spec.table_name, left_out)
        if columns is None:
            return None
        schema = self.config.state.schema_name
        recorded = record_shape(state, schema, backfill_id, ensure_row_type(state, schema, columns), columns)
        return recorded[1] if recorded else None

    def _record_error(self, state: psycopg.Connection, backfill_id: str, error: str) -> None:
        try:
            if not state.closed and state.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                self.store.record_error(state, backfill_id, error[:2000])
        except psycopg.Error as exc:  # the state database is what failed: nothing to record it in
            log.warning("backfill %s failed (%s) and the error could not be recorded: %s",
                        backfill_id, error[:200], type(exc).__name__)

    def _finish(self, state: psycopg.Connection, progress: Progress, started: float) -> None:
        if progress.status in FINISHED:
            progress.drain_warning = ""
            self.store.cleanup(state, progress.backfill_id)
        self._report(state, progress, started, progress.status, force=True)

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
