"""Drain: replication slot -> change log, acknowledging the slot only after the log commits.

Order of events for every batch of source transactions:
  1. rows are COPYed into the change log inside one open state-DB transaction (a huge source
     transaction streams through in chunks, so memory stays bounded);
  2. at a source COMMIT boundary the state transaction commits, together with the slot progress row;
  3. only then is the commit's end LSN reported to the server as flushed.
A crash anywhere before 3 replays from the slot; transactions the log already holds (their commit LSN is
below the recorded progress) are skipped on replay, so nothing is lost or written twice.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg import sql

from cdc_pipeline.capture.changes import LOG_COLUMNS, LogRow, RelationShape, row_change, truncate_row
from cdc_pipeline.capture.reconcile import watermark_hooks
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog, pgoutput
from cdc_pipeline.postgres.replication import Keepalive, ReplicationStream, XLogData
from cdc_pipeline.state.store import Store

log = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "cdc_pipeline.heartbeat"
PROBE_PREFIX = "cdc_pipeline.probe"
# Sessions that read or write record JSON must agree on how values print (see capture/json_text.py).
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres"
COPY_CHUNK = 5000

# A hook for logical messages with a given prefix (backfill watermarks): called with the message, its
# position (commit_lsn, commit_idx) and the state connection inside the drain's open transaction, after
# every change before it was written. Returns how many log rows it inserted at that position (they take
# commit_idx values idx, idx+1, ...), so the drain's numbering continues after them.
MessageHook = Callable[[pgoutput.LogicalMessage, int, int, psycopg.Connection], int]


@dataclass
class DrainStats:
    transactions: int = 0
    changes: int = 0
    skipped_transactions: int = 0
    committed_lsn: int = 0
    seconds: float = 0.0
    heartbeats: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.changes / self.seconds if self.seconds else 0.0


class Drain:
    def __init__(self, config: PipelineConfig, message_hooks: dict[str, MessageHook] | None = None) -> None:
        self.config = config
        self.schema = sql.Identifier(config.state.schema_name)
        # Backfill watermarks are always reconciled (capture/reconcile.py); callers may add hooks.
        self.hooks: dict[str, MessageHook] = {**watermark_hooks(config), **(message_hooks or {})}
        self._shapes: dict[int, RelationShape] = {}
        self._rows: list[LogRow] = []
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, seconds: float | None = None, until_idle: bool = False) -> DrainStats:
        cfg = self.config
        stats = DrainStats()
        started = time.monotonic()
        state = psycopg.connect(cfg.state_dsn, options=SESSION_OPTIONS)
        source = psycopg.connect(cfg.source.dsn, autocommit=True, options=SESSION_OPTIONS)
        try:
            # One drain per slot: the server allows one consumer per slot anyway; the lock makes the
            # second drain fail fast with a clear message instead of a replication error.
            got = state.execute("SELECT pg_try_advisory_lock(hashtext(%s))",
                                (f"cdc_pipeline.drain:{cfg.source.slot}",)).fetchone()
            state.commit()
            if not (got and got[0]):
                raise RuntimeError(f"another drain is already running for slot {cfg.source.slot!r}")
            committed = self._load_progress(state)
            stats.committed_lsn = committed
            stream = ReplicationStream(
                _with_options(cfg.source.dsn), cfg.source.slot, cfg.source.publication, committed
            )
            try:
                self._loop(stream, state, source, stats, started, seconds, until_idle)
            finally:
                stream.close()
            if cfg.state.retention_hours:
                stats.extra["retention_deleted"] = Store(cfg.state.schema_name).apply_retention(
                    state, cfg.state.retention_hours, [s.name for s in cfg.sinks])
                state.commit()
        finally:
            stats.seconds = time.monotonic() - started
            state.close()
            source.close()
        return stats

    def _loop(self, stream: ReplicationStream, state: psycopg.Connection, source: psycopg.Connection,
              stats: DrainStats, started: float, seconds: float | None, until_idle: bool) -> None:
        cfg = self.config.drain
        committed = stats.committed_lsn
        in_txn = False
        skipping = False
        lsn = idx = xid = 0
        ts: datetime | None = None
        pending_end = 0  # end LSN of the last complete transaction not yet committed to the log
        pending_since = 0.0
        pending_changes = 0
        last_heartbeat = 0.0
        probe: str | None = None
        changes_since_probe = 0
        idle = False
        decode = pgoutput.decode

        while True:
            now = time.monotonic()
            if not in_txn:
                if self._stop.is_set() or idle or (seconds is not None and now - started >= seconds):
                    break
                if now - last_heartbeat >= cfg.heartbeat_seconds:
                    self._emit(source, HEARTBEAT_PREFIX, "")
                    last_heartbeat = now
                if until_idle and probe is None:
                    probe = uuid.uuid4().hex
                    changes_since_probe = 0
                    self._emit(source, PROBE_PREFIX, probe)
            for frame in stream.frames(timeout=min(0.2, cfg.batch_ms / 1000)):
                if isinstance(frame, Keepalive):
                    if frame.reply_requested:
                        stream.send_status(committed)
                    continue
                assert isinstance(frame, XLogData)
                msg = decode(frame.payload)
                if isinstance(msg, pgoutput.Begin):
                    in_txn = True
                    lsn, xid, ts, idx = msg.final_lsn, msg.xid, msg.commit_ts, 0
                    skipping = lsn < committed  # the log already holds this transaction
                elif isinstance(msg, pgoutput.Commit):
                    in_txn = False
                    if skipping:
                        stats.skipped_transactions += 1
                        skipping = False
                        continue
                    stats.transactions += 1
                    if pending_end == 0:
                        pending_since = time.monotonic()
                    pending_end = msg.end_lsn
                    if (pending_changes >= cfg.batch_rows
                            or time.monotonic() - pending_since >= cfg.batch_ms / 1000):
                        committed = self._commit(state, stream, pending_end, ts)
                        pending_end = pending_changes = 0
                    break  # back to the outer loop to check stop conditions between transactions
                elif skipping:
                    continue
                elif isinstance(msg, (pgoutput.Insert, pgoutput.Update, pgoutput.Delete)):
                    self._rows.append(row_change(self._shapes[msg.relation_id], msg, lsn, idx, xid, ts))
                    idx += 1
                    pending_changes += 1
                    stats.changes += 1
                    changes_since_probe += 1
                    if len(self._rows) >= COPY_CHUNK:
                        self._copy(state)
                elif isinstance(msg, pgoutput.Relation):
                    self._relation(msg, source, state)
                elif isinstance(msg, pgoutput.Truncate):
                    for rid in msg.relation_ids:
                        self._rows.append(truncate_row(self._shapes[rid], lsn, idx, xid, ts))
                        idx += 1
                        pending_changes += 1
                        stats.changes += 1
                elif isinstance(msg, pgoutput.LogicalMessage):
                    prefix = msg.prefix
                    if prefix == HEARTBEAT_PREFIX:
                        stats.heartbeats += 1
                    elif prefix == PROBE_PREFIX:
                        if msg.content.decode() == probe:
                            idle = changes_since_probe == 0
                            probe = None
                    elif prefix in self.hooks:
                        self._copy(state)  # hooks see the log up to this point
                        used = self.hooks[prefix](msg, lsn, idx, state)
                        idx += used
                        stats.changes += used
            if not in_txn and pending_end and (
                pending_changes >= cfg.batch_rows or time.monotonic() - pending_since >= cfg.batch_ms / 1000
                or idle or self._stop.is_set()
            ):
                committed = self._commit(state, stream, pending_end, ts)
                pending_end = pending_changes = 0
        if pending_end:
            committed = self._commit(state, stream, pending_end, ts)
        stats.committed_lsn = committed

    # -- state writes -----------------------------------------------------------------------------
    def _copy(self, state: psycopg.Connection) -> None:
        if not self._rows:
            return
        stmt = sql.SQL("COPY {}.change_log ({}) FROM STDIN").format(
            self.schema, sql.SQL(", ").join(map(sql.Identifier, LOG_COLUMNS))
        )
        with state.cursor() as cur, cur.copy(stmt) as copy:
            for row in self._rows:
                copy.write_row(row)
        self._rows.clear()

    def _commit(self, state: psycopg.Connection, stream: ReplicationStream, end_lsn: int,
                ts: datetime | None) -> int:
        self._copy(state)
        state.execute(
            sql.SQL(
                "INSERT INTO {}.slot_progress AS p (slot, committed_lsn, last_commit_ts, last_heartbeat_at, "
                "updated_at) VALUES (%s, %s, %s, now(), now()) ON CONFLICT (slot) DO UPDATE SET "
                "committed_lsn = excluded.committed_lsn, last_commit_ts = excluded.last_commit_ts, "
                "last_heartbeat_at = now(), updated_at = now()"
            ).format(self.schema),
            (self.config.source.slot, end_lsn, ts),
        )
        state.commit()
        # Only now may the server forget these transactions.
        stream.send_status(end_lsn)
        return end_lsn

    def _load_progress(self, state: psycopg.Connection) -> int:
        row = state.execute(
            sql.SQL("SELECT committed_lsn FROM {}.slot_progress WHERE slot = %s").format(self.schema),
            (self.config.source.slot,),
        ).fetchone()
        state.commit()
        return int(row[0]) if row else 0

    def _relation(self, rel: pgoutput.Relation, source: psycopg.Connection, state: psycopg.Connection) -> None:
        info = catalog.describe_table(source, rel.namespace, rel.name)
        pk = info.primary_key if info else None
        self._shapes[rel.relation_id] = RelationShape.from_relation(rel, pk)
        columns = [{"name": c.name, "type_oid": c.type_oid, "key": bool(c.flags & 1),
                    "type_sql": _type_sql(info, c.name)} for c in rel.columns]
        state.execute(
            sql.SQL(
                "INSERT INTO {}.relations (table_schema, table_name, relation_id, replica_identity, columns, "
                "primary_key, updated_at) VALUES (%s, %s, %s, %s, %s, %s, now()) "
                "ON CONFLICT (table_schema, table_name) DO UPDATE SET relation_id = excluded.relation_id, "
                "replica_identity = excluded.replica_identity, columns = excluded.columns, "
                "primary_key = excluded.primary_key, updated_at = now()"
            ).format(self.schema),
            (rel.namespace, rel.name, rel.relation_id, rel.replica_identity,
             psycopg.types.json.Jsonb(columns), list(pk or [])),
        )

    @staticmethod
    def _emit(source: psycopg.Connection, prefix: str, content: str) -> None:
        source.execute("SELECT pg_logical_emit_message(true, %s, %s)", (prefix, content))


def _type_sql(info: catalog.TableInfo | None, column: str) -> str | None:
    if info is None:
        return None
    return next((c.type_sql for c in info.columns if c.name == column), None)


def _with_options(dsn: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, options=SESSION_OPTIONS)
