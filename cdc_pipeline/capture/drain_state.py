"""What the drain carries while it reads: the run's figures, the source transaction being read, and what one
replication session's loop carries from message to message (capture/drain.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class DrainStats:
    transactions: int = 0
    changes: int = 0
    skipped_transactions: int = 0
    committed_lsn: int = 0
    seconds: float = 0.0
    heartbeats: int = 0
    sessions: int = 0  # replication sessions started (1 + reconnects)
    retries: int = 0
    last_error: str | None = None
    gaps: list[str] = field(default_factory=list)
    # logical messages under one of the pipeline's prefixes whose content could not be used, by prefix
    skipped_messages: dict[str, int] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.changes / self.seconds if self.seconds else 0.0


@dataclass
class Txn:
    """The source transaction being read: its commit position and time, the next change's index in it,
    its annotation in force (capture/annotations.py), and whether the log already holds it."""

    open: bool = False
    lsn: int = 0
    idx: int = 0
    xid: int = 0
    ts: datetime | None = None
    note: str | None = None
    skipping: bool = False

    def begin(self, lsn: int, xid: int, ts: datetime, skipping: bool) -> None:
        self.open, self.lsn, self.idx, self.xid, self.ts, self.note, self.skipping = True, lsn, 0, xid, ts, None, skipping

    def at(self) -> tuple[int, int, int, datetime | None, str | None]:
        """The next row's position and its transaction's facts, as the row builders take them."""
        return self.lsn, self.idx, self.xid, self.ts, self.note


@dataclass
class Pass:
    """What one session's loop carries from message to message."""

    committed: int  # the log holds everything up to here; the server was told so
    pending_end: int = 0  # end LSN of the last complete transaction not yet committed to the log
    pending_since: float = 0.0  # when the oldest of them ended
    pending_changes: int = 0
    hooked: bool = False  # a hook wrote in this batch: commit at its transaction's end (its row locks go)
    last_heartbeat: float = 0.0
    probe: str | None = None
    changes_since_probe: int = 0
    idle: bool = False
    # A time limit may end the run only once the stream has reached the server's position at the start of
    # this session (the first heartbeat): a transaction longer than the limit to re-read would otherwise
    # never complete.
    target: int | None = None
    caught_up: bool = False
