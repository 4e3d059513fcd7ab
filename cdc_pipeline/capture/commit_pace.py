"""When the drain commits the transactions it holds to the change log: the one rule, pure.

A commit costs about the same whatever it holds (a flush of the state database's WAL), so a busy stream
should gather transactions between commits and a light one should not make them wait. The rule: commit at
once when something needs it (a hook wrote and holds row locks, the stream is quiet, the drain stops or is
idle), at `batch_rows` changes, and otherwise once the oldest transaction held has waited `PACE_FACTOR`
times the last commit's duration (at least `PACE_FLOOR_MS`, at most `batch_ms`). Committing thus spends at
most about 1/PACE_FACTOR of the time on commits, and a change waits a few commit durations, not `batch_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass

PACE_FACTOR = 6.0
PACE_FLOOR_MS = 15.0


@dataclass
class CommitPace:
    batch_rows: int
    batch_ms: float
    last_commit_ms: float = 0.0  # how long the last commit took

    def wait_ms(self) -> float:
        """How long the oldest transaction held may wait for a commit."""
        return min(float(self.batch_ms), max(PACE_FLOOR_MS, PACE_FACTOR * self.last_commit_ms))

    def due(self, changes: int, waited_ms: float, urgent: bool) -> bool:
        """Whether to commit now, holding `changes` changes of transactions the oldest of which ended
        `waited_ms` ago; `urgent`: something needs the commit now (see the module doc)."""
        return urgent or changes >= self.batch_rows or waited_ms >= self.wait_ms()

    def committed(self, took_ms: float) -> None:
        self.last_commit_ms = took_ms
