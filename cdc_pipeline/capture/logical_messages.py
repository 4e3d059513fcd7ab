"""The drain's logical messages: probes, annotations, schema changes, backfill watermarks (hooks) and heartbeats.

The logical-message stream is application input: any prefix, content or size. Only the pipeline's own
prefixes act, and content that cannot be used is skipped, logged by position and length (never by content)
and counted in the run's figures; it never stops the drain.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import psycopg

from cdc_pipeline.capture import annotations
from cdc_pipeline.capture.changes import LogRow
from cdc_pipeline.capture.drain_state import DrainStats, Pass, Txn
from cdc_pipeline.capture.logwriter import LogWriter
from cdc_pipeline.capture.prefixes import DDL_PREFIX, HEARTBEAT_PREFIX, PROBE_PREFIX
from cdc_pipeline.capture.schema_changes import SchemaChanges
from cdc_pipeline.postgres import pgoutput

# The drain's own logger: users filter the drain's warnings by one name.
log = logging.getLogger("cdc_pipeline.capture.drain")

_PROBE_SHAPE = re.compile(rb"[0-9a-f]{32}")  # uuid4().hex: an earlier run's probe, replayed

# A hook for logical messages with a given prefix (backfill watermarks): called with the message, its
# position (commit_lsn, commit_idx) and the state connection inside the drain's open transaction, after
# every change before it was written. Returns (positions taken, rows logged): its rows take commit_idx values
# from idx on (some may stay empty), and the drain's numbering continues after the positions taken.
MessageHook = Callable[[pgoutput.LogicalMessage, int, int, psycopg.Connection], tuple[int, int]]


class LogicalMessages:
    def __init__(self, hooks: dict[str, MessageHook], ddl: SchemaChanges, writer: LogWriter,
                 gaps_running: Callable[[], bool]) -> None:
        self.hooks = hooks
        self.ddl = ddl
        self.writer = writer
        self.gaps_running = gaps_running
        self.ascii_only = False  # the state database is not UTF-8: annotations must be ASCII to be stored

    def handle(self, msg: pgoutput.LogicalMessage, txn: Txn, run: Pass, state: psycopg.Connection,
               source: psycopg.Connection, stats: DrainStats) -> LogRow | None:
        """Act on one message; returns the row to log at the transaction's next position, if any."""
        prefix = msg.prefix
        if prefix == PROBE_PREFIX:
            if run.probe is not None and msg.content == run.probe.encode():
                # Idle: nothing new since the probe, and no gap backfill still needs this drain.
                run.idle = run.changes_since_probe == 0 and not self.gaps_running()
                run.probe = None
            elif not _PROBE_SHAPE.fullmatch(msg.content):  # not an earlier drain's probe
                skip(msg, stats, "not a probe of this pipeline")
        elif prefix == annotations.ANNOTATIONS_PREFIX:
            if msg.transactional and txn.open:
                txn.note = self._annotation(msg, stats) or txn.note  # a refused one changes nothing
            else:
                skip(msg, stats, "not transactional")
        elif prefix == DDL_PREFIX:  # schema changes from the source's event trigger
            row = self.ddl.row(msg.content, txn.at(), source, state) \
                if msg.transactional and txn.open else "not transactional"
            if not isinstance(row, str):
                return row
            skip(msg, stats, row)
        elif prefix in self.hooks:
            self.writer.flush(state)  # hooks see the log up to this point
            taken, logged = self._hook(msg, txn.lsn if txn.open else msg.lsn, txn.idx, state, stats)
            run.hooked = True
            txn.idx += taken
            stats.changes += logged
        elif prefix == HEARTBEAT_PREFIX:
            if msg.content:  # ours are empty
                skip(msg, stats, "not a heartbeat of this pipeline")
            else:
                stats.heartbeats += 1
        return None

    def _annotation(self, msg: pgoutput.LogicalMessage, stats: DrainStats) -> str | None:
        try:
            text, refused = annotations.parse(msg.content, ascii_only=self.ascii_only)
        except Exception as exc:  # noqa: BLE001 - application input never stops the drain
            text, refused = None, f"unreadable ({type(exc).__name__})"
        if refused is not None:
            skip(msg, stats, refused)
        return text

    def _hook(self, msg: pgoutput.LogicalMessage, lsn: int, idx: int, state: psycopg.Connection,
              stats: DrainStats) -> tuple[int, int]:
        hook = self.hooks[msg.prefix]
        before = getattr(hook, "refused", 0)
        result = hook(msg, lsn, idx, state)
        refused = getattr(hook, "refused", 0) - before  # the hook logged why
        if refused:
            stats.skipped_messages[msg.prefix] = stats.skipped_messages.get(msg.prefix, 0) + refused
        return result


def skip(msg: pgoutput.LogicalMessage, stats: DrainStats, why: str) -> None:
    """A message under one of our prefixes that cannot be used: logged by position and length (the
    content is the application's, never logged), counted, skipped."""
    what = ("annotation" if msg.prefix == annotations.ANNOTATIONS_PREFIX
            else f"logical message under prefix {msg.prefix}")
    log.warning("drain: ignored the %s at %X/%X (%d bytes): %s", what, msg.lsn >> 32, msg.lsn & 0xFFFFFFFF,
                len(msg.content), why)
    stats.skipped_messages[msg.prefix] = stats.skipped_messages.get(msg.prefix, 0) + 1
