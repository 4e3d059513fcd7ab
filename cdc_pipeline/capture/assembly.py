"""The drain's reading state between the stream's messages (capture/drain.py): the transaction being read,
the complete ones not committed to the log yet (the commit rule, written once), and the pulse (heartbeats
and the idle probe). Plain values: no I/O but the `emit` the pulse is handed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from cdc_pipeline.capture.prefixes import HEARTBEAT_PREFIX, PROBE_PREFIX
from cdc_pipeline.postgres import pgoutput

# Where a log row goes: (commit_lsn, commit_idx, xid, commit_ts, annotation).
At = tuple[int, int, int, datetime | None, str | None]


@dataclass
class Txn:
    """The source transaction being read, between its BEGIN and COMMIT: where its next log row goes."""

    lsn: int = 0
    idx: int = 0
    xid: int = 0
    ts: datetime | None = None
    note: str | None = None  # the annotation in force (capture/annotations.py)
    open: bool = False
    skipping: bool = False  # the log already holds it (a replay from the slot)

    def begin(self, msg: pgoutput.Begin, committed: int) -> None:
        self.lsn, self.xid, self.ts, self.idx, self.note = msg.final_lsn, msg.xid, msg.commit_ts, 0, None
        self.open = True
        self.skipping = self.lsn < committed

    def at(self) -> At:
        return self.lsn, self.idx, self.xid, self.ts, self.note


@dataclass
class Pending:
    """Complete transactions read but not committed to the log yet, and when they are due: `batch_rows`
    rows, `batch_ms` since the first, or a hook that wrote (its row locks go at the commit)."""

    rows: int
    ms: int
    end: int = 0  # end LSN of the last complete transaction not yet committed to the log
    since: float = 0.0
    changes: int = 0
    hooked: bool = False

    def close(self, end_lsn: int) -> None:
        """A transaction read to its COMMIT."""
        if not self.end:
            self.since = time.monotonic()
        self.end = end_lsn

    def due(self) -> bool:
        return bool(self.end) and (self.changes >= self.rows or self.hooked
                                   or time.monotonic() - self.since >= self.ms / 1000)

    def clear(self) -> None:
        self.end = self.changes = 0
        self.hooked = False


@dataclass
class Pulse:
    """A heartbeat every `every` seconds, so an idle source still advances the slot; with `until_idle` a probe
    whose return with no change read since says the stream is idle. A time limit may end the run only once
    the stream has reached the server's position at the session's first heartbeat (`caught_up`): a
    transaction longer than the limit to re-read would otherwise never complete."""

    every: float
    until_idle: bool
    last: float = 0.0
    probe: str | None = None
    changes: int = 0  # row changes read since the probe went out
    target: int | None = None
    caught_up: bool = False
    idle: bool = False

    def tick(self, emit: Callable[[str, str], int]) -> None:
        """Between transactions: the heartbeat when due, the probe when none is out."""
        now = time.monotonic()
        if now - self.last >= self.every:
            at = emit(HEARTBEAT_PREFIX, "")
            self.target = at if self.target is None else self.target
            self.last = now
        if self.until_idle and self.probe is None:
            self.probe = uuid.uuid4().hex
            self.changes = 0
            emit(PROBE_PREFIX, self.probe)

    def reached(self, lsn: int) -> None:
        self.caught_up = self.caught_up or (self.target is not None and lsn >= self.target)

    def answered(self, content: bytes) -> bool | None:
        """The probe came back: whether nothing was read since (None: not this run's probe)."""
        if self.probe is None or content != self.probe.encode():
            return None
        self.probe = None
        return self.changes == 0
