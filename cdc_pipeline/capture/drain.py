"""Drain: replication slot -> change log, acknowledging the slot only after the log commits.

Order of events for every batch of source transactions:
  1. rows are COPYed into the change log inside one open state-DB transaction (a huge source
     transaction streams through in chunks bounded by rows and bytes, so memory stays bounded);
  2. at a source COMMIT boundary the state transaction commits, together with the slot progress row;
  3. only then is the commit's end LSN reported to the server as flushed.
A crash anywhere before 3 replays from the slot; transactions the log already holds (their commit LSN is
below the recorded progress) are skipped on replay, so nothing is lost or written twice.

The run is supervised: a lost connection (replication, source, state database) ends the session, drops
what was not committed and starts a new one after a capped, jittered backoff; only permanent failures
(capture/faults.py) and gaps under ``drain.on_gap: stop`` (capture/gap.py) end the run with an error.
While the loop is busy (a long reconciliation, a slow commit), a status keeper thread reports the last
flushed position so the server never times the stream out.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime

import psycopg
from psycopg import sql

from cdc_pipeline.admin import ddl_capture
from cdc_pipeline.capture import failover, faults, gap
from cdc_pipeline.capture.changes import LogRow, RelationShape, row_change, truncate_row
from cdc_pipeline.capture.commit_pace import CommitPace
from cdc_pipeline.capture.drain_state import DrainStats as DrainStats  # re-exported
from cdc_pipeline.capture.drain_state import Pass, Txn
from cdc_pipeline.capture.logical_messages import LogicalMessages, MessageHook
from cdc_pipeline.capture.logwriter import LogWriter
from cdc_pipeline.capture.prefixes import HEARTBEAT_PREFIX, PROBE_PREFIX
from cdc_pipeline.capture.reconcile import watermark_hooks
from cdc_pipeline.capture.schema_changes import SchemaChanges
from cdc_pipeline.config import PipelineConfig, redact
from cdc_pipeline.core.backoff import next_delay_ms
from cdc_pipeline.postgres import catalog, pgoutput, session
from cdc_pipeline.postgres.replication import Keepalive, ReplicationStream, XLogData, status_interval
from cdc_pipeline.postgres.session import SESSION_OPTIONS as SESSION_OPTIONS  # re-exported
from cdc_pipeline.state import retention

log = logging.getLogger(__name__)

APP_NAME = "cdc_pipeline.drain"
_ROW_CHANGES = (pgoutput.Insert, pgoutput.Update, pgoutput.Delete)
COPY_CHUNK = 5000
# The state session may run a page reconciliation (one statement over a large page): generous, but a
# hung call still ends. The source session only emits messages and reads the catalog.
STATE_STATEMENT_TIMEOUT_MS = 15 * 60 * 1000
STATE_LOCK_TIMEOUT_MS = 60 * 1000
SOURCE_STATEMENT_TIMEOUT_MS = 60 * 1000
SLOT_BUSY_GRACE_S = 3.0
# A just-stopped drain frees its lock when the server has seen it go; a new one waits that long first.
START_LOCK_GRACE_SECONDS = 5.0


class Drain:
    def __init__(self, config: PipelineConfig, message_hooks: dict[str, MessageHook] | None = None) -> None:
        self.config = config
        self.schema = sql.Identifier(config.state.schema_name)
        # Backfill watermarks are always reconciled (capture/reconcile.py); callers may add hooks.
        self.hooks: dict[str, MessageHook] = {**watermark_hooks(config), **(message_hooks or {})}
        self.writer = LogWriter(config.state.schema_name, config.source.slot, COPY_CHUNK, config.drain.batch_bytes)
        self.gaps = gap.GapBackfills(config)
        self._shapes: dict[int, RelationShape] = {}
        self._configured = frozenset(t.qualified for t in config.tables)
        self.ddl = SchemaChanges(self._configured, config.source.publication, config.state.schema_name)
        self._stop = threading.Event()
        self._source: psycopg.Connection | None = None
        self._streamed = False  # a replication session of this process got going at least once
        self._phase = "starting"
        self.messages = LogicalMessages(self.hooks, self.ddl, self.writer, self.gaps.running)
        self.stats: DrainStats | None = None

    def stop(self) -> None:
        self._stop.set()
        self.gaps.signal_stop()

    # -- the supervised run -----------------------------------------------------------------------
    def run(self, seconds: float | None = None, until_idle: bool = False) -> DrainStats:
        """Stream until stopped, idle (``until_idle``) or ``seconds`` have passed *and* the stream has
        caught up with the server's position at its start; ride through lost connections."""
        cfg = self.config
        stats = DrainStats()
        self.stats = stats  # read live by the metrics (ops/)
        started = time.monotonic()
        deadline = started + seconds if seconds is not None else None
        attempt = 0
        busy_since: float | None = None
        try:
            while True:
                before, began = stats.committed_lsn, time.monotonic()
                try:
                    self._session(stats, deadline, until_idle)
                    return stats
                except Exception as exc:
                    self.writer.discard()
                    self._shapes.clear()
                    # A slot busy at start may be a killed predecessor's walsender not gone yet: wait a
                    # moment, quietly, before calling it another consumer.
                    if faults.sqlstate(exc) == "55006" and not self._streamed:
                        busy_since = busy_since or time.monotonic()
                        if time.monotonic() - busy_since < SLOT_BUSY_GRACE_S:
                            log.info("drain: slot busy (%s); trying again", exc)
                            if self._stop.wait(0.2):
                                return stats
                            continue
                    fix = faults.permanent(exc, cfg.source.slot, cfg.source.publication, self._streamed)
                    if fix is not None:
                        if isinstance(exc, faults.DrainFatal):
                            raise
                        raise faults.DrainFatal(redact(fix)) from exc
                    if not faults.transient(exc):
                        raise
                    if self._stop.is_set():
                        return stats
                    # A session that got somewhere starts the backoff over.
                    progressed = stats.committed_lsn > before or time.monotonic() - began > 60
                    attempt = 1 if progressed else attempt + 1
                    delay = next_delay_ms(attempt, cfg.drain.retry_initial_ms, cfg.drain.retry_max_ms) / 1000
                    if deadline is not None and time.monotonic() + delay >= deadline:
                        raise  # a time-limited run (a sensor tick) ends with the error; the next one retries
                    cause = redact(" ".join(f"{type(exc).__name__}: {exc}".split()))
                    stats.retries += 1
                    stats.last_error = cause
                    log.warning("drain: lost while %s: %s; retry %d in %.1f s, waiting for %s", self._phase, cause,
                                attempt, delay, faults.WAITING_FOR.get(self._phase, "the databases"))
                    if self._stop.wait(delay):
                        return stats
        finally:
            stats.seconds = time.monotonic() - started
            self.gaps.stop()

    def _session(self, stats: DrainStats, deadline: float | None, until_idle: bool) -> None:
        cfg = self.config
        self._phase = "connecting to the state database"
        state = session.connect(cfg.state_dsn, durable=True, statement_timeout_ms=STATE_STATEMENT_TIMEOUT_MS,
                                lock_timeout_ms=STATE_LOCK_TIMEOUT_MS, application_name=APP_NAME)
        source: psycopg.Connection | None = None
        primary: psycopg.Connection | None = None
        stream: ReplicationStream | None = None
        try:
            # One drain per slot: the server allows one consumer per slot anyway; the lock makes the
            # second drain fail fast with a clear message instead of a replication error.
            self._phase = "taking the drain lock"
            # The grace is for a first start only; after a reconnect a held lock is most likely our own
            # old session not yet timed out, so it is waited for with the logged backoff instead.
            grace = 0.0 if self._streamed else START_LOCK_GRACE_SECONDS
            if not session.lock_within(state, f"cdc_pipeline.drain:{cfg.source.slot}", grace):
                if self._streamed:
                    raise faults.LockStillHeld(f"the drain lock for slot {cfg.source.slot!r} is still held")
                raise faults.DrainFatal(f"another drain is already running for slot {cfg.source.slot!r}")
            state.commit()
            self.messages.ascii_only = (state.info.parameter_status("server_encoding") or "UTF8") != "UTF8"
            self._phase = "connecting to the source database"
            source = session.connect(cfg.source.dsn, autocommit=True, application_name=APP_NAME,
                                     statement_timeout_ms=SOURCE_STATEMENT_TIMEOUT_MS)
            # A standby as the source (source.primary_dsn): heartbeats and probes are written on its primary
            # and reach the slot through the standby's replay.
            primary = source if not cfg.source.primary_dsn else session.connect(
                cfg.source.primary_dsn, autocommit=True, application_name=APP_NAME,
                statement_timeout_ms=SOURCE_STATEMENT_TIMEOUT_MS)
            committed = self._prepare(source, state, stats)
            self.ddl.key = ddl_capture.load_key(source, cfg)  # None: catalog mode (admin/ddl_capture.py)
            self._source = source
            self._phase = "starting replication"
            stream = ReplicationStream(cfg.source.dsn, cfg.source.slot, cfg.source.publication, committed)
            self._streamed = True
            stats.sessions += 1
            stream.keep_alive(status_interval(source, cfg.drain.status_interval_seconds))
            self.gaps.start(state)
            self._phase = "streaming"
            self._loop(stream, state, source, primary, stats, committed, deadline, until_idle)
            if cfg.state.retention_hours:
                stats.extra["retention_deleted"] = retention.trim_log(
                    state, cfg.state.schema_name, cfg.state.retention_hours, [s.name for s in cfg.sinks])
                state.commit()
        finally:
            stats.extra["copies"] = self.writer.copies
            if stream is not None:
                stream.close()
            for conn in (state, source, primary):
                if conn is not None and not conn.closed:
                    conn.close()

    def _prepare(self, source: psycopg.Connection, state: psycopg.Connection, stats: DrainStats) -> int:
        """Check the slot and publication, find gaps; returns the position to stream from."""
        cfg = self.config
        slot = catalog.slot_position(source, cfg.source.slot)
        if slot is None:
            slot = failover.slot_missing(cfg, source, state)  # raises, or re-creates it after a failover
        if slot[1] == "lost":
            raise faults.DrainFatal(faults.slot_lost(cfg.source.slot))
        if not catalog.publication_exists(source, cfg.source.publication):
            raise faults.DrainFatal(faults.publication_gone(cfg.source.publication))
        recorded = self.writer.load_progress(state, source)
        confirmed = slot[0]
        if recorded is None or recorded >= confirmed:
            stats.committed_lsn = max(stats.committed_lsn, recorded or 0)
            return recorded or 0
        found = gap.Gap(recorded, confirmed, tuple(t.qualified for t in cfg.tables))
        if cfg.drain.on_gap == "stop":
            raise faults.DrainFatal(gap.stop_message(cfg, found))
        tables = gap.record(cfg, source, found)
        log.warning("drain: gap in the change log (%s): accepted the slot's position and backfilling %s",
                    found.describe(), ", ".join(tables) or "nothing (no sink receives those tables)")
        stats.gaps.append(found.describe())
        stats.committed_lsn = confirmed
        return confirmed

    # -- the loop ---------------------------------------------------------------------------------
    def _loop(self, stream: ReplicationStream, state: psycopg.Connection, source: psycopg.Connection,
              primary: psycopg.Connection, stats: DrainStats, committed: int, deadline: float | None,
              until_idle: bool) -> None:
        cfg = self.config.drain
        run = Pass(committed=committed)
        txn = Txn()
        pace = CommitPace(cfg.batch_rows, cfg.batch_ms)
        writer, shapes, decode = self.writer, self._shapes, pgoutput.decode
        while True:
            if not txn.open:
                if self._stop.is_set() or run.idle or (
                        deadline is not None and time.monotonic() >= deadline and run.caught_up):
                    break
                self._between_transactions(primary, run, until_idle)
            for frame in stream.frames(timeout=min(0.2, cfg.batch_ms / 1000)):
                if isinstance(frame, Keepalive):
                    run.caught_up = run.caught_up or (run.target is not None and frame.wal_end >= run.target)
                    if frame.reply_requested:
                        stream.send_status(run.committed)
                    continue
                assert isinstance(frame, XLogData)
                msg = decode(frame.payload)
                if type(msg) in _ROW_CHANGES and not txn.skipping:  # the hot path, inline: most messages
                    writer.add(row_change(shapes[msg.relation_id], msg, txn.lsn, txn.idx, txn.xid, txn.ts, txn.note),
                               state)
                    txn.idx += 1
                    run.pending_changes += 1
                    run.changes_since_probe += 1
                    stats.changes += 1
                elif self._on_message(msg, txn, run, state, source, stats):
                    break  # a transaction ended: back to check the commit rule and the stop conditions
            if not txn.open and run.pending_end:
                urgent = run.hooked or run.idle or self._stop.is_set() or not stream.waiting()
                if pace.due(run.pending_changes, (time.monotonic() - run.pending_since) * 1000, urgent):
                    self._commit_pending(state, stream, stats, run, txn.ts, pace)
        if run.pending_end:
            self._commit_pending(state, stream, stats, run, txn.ts, pace)
        stats.committed_lsn = max(stats.committed_lsn, run.committed)

    def _between_transactions(self, primary: psycopg.Connection, run: Pass, until_idle: bool) -> None:
        """The heartbeat every heartbeat_seconds (the first one is the position the session must reach
        before a time limit may end it), and with --until-idle the probe whose return says idle; both
        written on the primary (the source itself unless it is a standby)."""
        now = time.monotonic()
        if now - run.last_heartbeat >= self.config.drain.heartbeat_seconds:
            at = self._emit(primary, HEARTBEAT_PREFIX, "")
            run.target = at if run.target is None else run.target
            run.last_heartbeat = now
        if until_idle and run.probe is None:
            run.probe = uuid.uuid4().hex
            run.changes_since_probe = 0
            self._emit(primary, PROBE_PREFIX, run.probe)

    def _on_message(self, msg: pgoutput.Message, txn: Txn, run: Pass, state: psycopg.Connection,
                    source: psycopg.Connection, stats: DrainStats) -> bool:
        """Act on one decoded message (a row change of a transaction being logged is the loop's own, inline);
        True at the end of a transaction."""
        if isinstance(msg, pgoutput.Begin):
            txn.begin(msg.final_lsn, msg.xid, msg.commit_ts, skipping=msg.final_lsn < run.committed)
        elif isinstance(msg, pgoutput.Commit):
            txn.open = False
            run.caught_up = run.caught_up or (run.target is not None and msg.end_lsn >= run.target)
            if txn.skipping:  # the log already holds this transaction: read on
                stats.skipped_transactions += 1
                txn.skipping = False
                return False
            stats.transactions += 1
            if run.pending_end == 0:
                run.pending_since = time.monotonic()
            run.pending_end = msg.end_lsn
            return True
        elif isinstance(msg, pgoutput.Relation):
            # Before the skip: the server sends a relation once per session, so one inside a skipped
            # transaction still describes the changes of the transactions after it.
            self._log(self._relation(msg, source, state, not txn.skipping, txn.at()), txn, run, state)
        elif txn.skipping:
            pass
        elif isinstance(msg, pgoutput.Truncate):
            for rid in msg.relation_ids:
                self._log(truncate_row(self._shapes[rid], *txn.at()), txn, run, state, stats)
        elif isinstance(msg, pgoutput.LogicalMessage):
            self._log(self.messages.handle(msg, txn, run, state, source, stats), txn, run, state)
        return False

    def _log(self, row: LogRow | None, txn: Txn, run: Pass, state: psycopg.Connection,
             stats: DrainStats | None = None) -> None:
        """A row into the log at the transaction's next position (`stats`: a change of a table, counted)."""
        if row is None:
            return
        self.writer.add(row, state)
        txn.idx += 1
        run.pending_changes += 1
        if stats is not None:
            stats.changes += 1

    # -- state writes -----------------------------------------------------------------------------
    def _commit_pending(self, state: psycopg.Connection, stream: ReplicationStream, stats: DrainStats, run: Pass,
                        ts: datetime | None, pace: CommitPace) -> None:
        began = time.monotonic()
        run.committed = self._commit(state, stream, stats, run.pending_end, ts)
        pace.committed((time.monotonic() - began) * 1000)
        run.pending_end = run.pending_changes = 0
        run.hooked = False

    def _commit(self, state: psycopg.Connection, stream: ReplicationStream, stats: DrainStats, end_lsn: int,
                ts: datetime | None) -> int:
        self.writer.commit(state, end_lsn, ts)
        stats.committed_lsn = end_lsn
        # Only now may the server forget these transactions.
        stream.send_status(end_lsn)
        if self.ddl.rereads and self._source is not None:  # rows a schema change rewrote unseen: read again
            self.ddl.start_rereads(self.config, self._source, state, self.gaps, end_lsn)
        return end_lsn

    def _relation(self, rel: pgoutput.Relation, source: psycopg.Connection, state: psycopg.Connection,
                  write: bool, at: tuple[int, int, int, datetime | None, str | None]) -> LogRow | None:
        shape, row = self.ddl.on_relation(rel, source, state, write, at)
        self._shapes[rel.relation_id] = shape
        return row

    @staticmethod
    def _emit(source: psycopg.Connection, prefix: str, content: str) -> int:
        row = source.execute("SELECT (pg_logical_emit_message(true, %s, %s) - '0/0')::bigint",
                             (prefix, content)).fetchone()
        return int(row[0]) if row else 0
