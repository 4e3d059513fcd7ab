"""One record per group in flight (pure: indexes in, indexes out).

A record the broker rejects must not let the same key's next record be stored before it: the idempotent
producer keeps a partition's order through its own retries, not through a rejection (the next batch in
flight is re-sequenced and stored, the rejected one parked and stored later). So a group's next message
is produced only once the previous one's delivery report says it was stored; a group whose message failed
produces nothing more in the call (reported NOT_SENT: the engine hands it back in order). Different groups,
and ungrouped messages, go out together.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class GroupFlight:
    def __init__(self, groups: Sequence[str | None]) -> None:
        self._groups = groups
        self._waiting: dict[str, deque[int]] = {}  # each group's messages after the one out
        self._ready: list[int] = []
        for i, group in enumerate(groups):
            if group is None:
                self._ready.append(i)
            elif group in self._waiting:
                self._waiting[group].append(i)
            else:
                self._waiting[group] = deque()
                self._ready.append(i)

    def take(self) -> list[int]:
        """The messages that may be produced now, in batch order."""
        ready, self._ready = sorted(self._ready), []
        return ready

    def has_ready(self) -> bool:
        return bool(self._ready)

    def stored(self, i: int) -> None:
        """Message ``i`` was acknowledged: its group's next may go."""
        group = self._groups[i]
        if group is not None and self._waiting[group]:
            self._ready.append(self._waiting[group].popleft())

    def failed(self, i: int) -> list[int]:
        """Message ``i`` was not stored: its group's later messages are not sent in this call (returned)."""
        group = self._groups[i]
        if group is None:
            return []
        rest = list(self._waiting[group])
        self._waiting[group].clear()
        return rest

    def stop(self) -> list[int]:
        """Nothing more goes out (the producer failed): every message not produced yet."""
        rest = sorted([*self._ready, *(i for q in self._waiting.values() for i in q)])
        self._ready = []
        for q in self._waiting.values():
            q.clear()
        return rest
