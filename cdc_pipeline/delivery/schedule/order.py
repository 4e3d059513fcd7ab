"""Per-group order of one batch handed to a sink: the engine's hold-back policy, as a pure value.

A group is the unit of order. Once a message of a group fails, the group's later messages are held
behind it (parked with it and retried after it), whatever the sink did with them; other groups flow.
Ungrouped messages (group None) order nothing. `GroupOrder` decides what the sink gets in each call
and turns the sink's raw results (None, an error, NOT_SENT) into the batch's outcome:

* a sink that stops at a failure answers for the messages up to it only (`answered`: every message after the
  results it returned is NOT_SENT, not attempted); they come back in the next call, minus the messages of
  groups that failed (held, never sent);
* a sink that pipelines (`one_per_group`: its `Limits` not `ordered`) gets rounds: at most one message per group per call, a
  group's next message only after the previous one was acknowledged;
* what a sink did deliver past its group's failure in the same call is held all the same.

No I/O: `delivery/schedule/dispatch.py` runs it against a sink.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence

from cdc_pipeline.core.positions import Position
from cdc_pipeline.sinks.base import NOT_SENT, NotSent, OutboundMessage

HELD = "held behind an earlier failed message of its group"
_UNDECIDED = NotSent("\x00undecided")  # placeholder; never returned (compared by identity)


def position_of(message: OutboundMessage) -> Position:
    lsn, _, idx = message.key.partition(":")
    return int(lsn), int(idx)


def split_held(messages: Sequence[OutboundMessage], parked_groups: Collection[str | None],
               failures: Iterable[tuple[Position, str | None]]) -> tuple[list[OutboundMessage], list[OutboundMessage]]:
    """(to send, held back) before the sink sees anything: a message is held when its group already has
    a parked message, or when an earlier message of its group failed before reaching the sink (the
    transform could not process it). `failures`: (position, group) of those."""
    first: dict[str | None, Position] = {}
    for pos, g in failures:
        if g is not None and (g not in first or pos < first[g]):
            first[g] = pos
    if not parked_groups and not first:  # the usual batch: no per-message test
        return list(messages), []
    send: list[OutboundMessage] = []
    held: list[OutboundMessage] = []
    for m in messages:
        g = m.group
        behind = g is not None and (g in parked_groups or (g in first and position_of(m) > first[g]))
        (held if behind else send).append(m)
    return send, held


class SinkContractError(RuntimeError):
    """A sink's results cannot be squared with its order (wrong count, or a group sent out of order)."""


def answered(results: Sequence[str | None], n: int, sink: str) -> list[str | None]:
    """A sink's results for a call of `n` messages, one per message: the sink may answer for a prefix of the call
    only (it stopped there), every message after that is NOT_SENT. The one place a short answer is filled in."""
    if len(results) > n:
        raise SinkContractError(f"sink {sink!r} returned {len(results)} results for a call of {n} messages")
    return [*results, *([NOT_SENT] * (n - len(results)))]


class GroupOrder:
    def __init__(self, groups: Sequence[str | None], one_per_group: bool = False) -> None:
        self.groups = groups
        self.one_per_group = one_per_group
        self.results: list[str | None] = [_UNDECIDED] * len(groups)
        self.parked: list[int] = []  # indexes settled as failed or held, in settling order
        self.delivered = 0
        self._failed: set[str] = set()
        self._pending: list[int] = list(range(len(groups)))  # sequential: still to send, in order
        # Rounds: each group's messages still to send, and the ungrouped ones (sent all at once).
        self._queues: dict[str, deque[int]] = {}
        self._ungrouped: list[int] = []
        if one_per_group:
            for i, g in enumerate(groups):
                if g is None:
                    self._ungrouped.append(i)
                else:
                    self._queues.setdefault(g, deque()).append(i)
            self._pending = []

    def next_call(self) -> list[int]:
        """The indexes to hand the sink next, in batch order (empty: the batch is settled). Messages of
        failed groups are settled as held here, unsent."""
        if not self.one_per_group:
            send = [i for i in self._pending if not self._hold(i)]
            self._pending = []
            return send
        send, self._ungrouped = self._ungrouped, []
        for g in list(self._queues):
            queue = self._queues[g]
            if g in self._failed:
                for i in queue:
                    self._settle(i, HELD)
                del self._queues[g]
                continue
            send.append(queue.popleft())
            if not queue:
                del self._queues[g]
        send.sort()
        return send

    def record(self, call: Sequence[int], results: Sequence[str | None]) -> None:
        """The sink's results for `call` (as returned by `next_call`)."""
        if len(results) != len(call):
            raise SinkContractError(f"{len(results)} results for {len(call)} messages")
        unsent: list[int] = []
        stalled: set[str] = set()  # groups with an unsent message in this call
        for i, r in zip(call, results, strict=True):
            g = self.groups[i]
            if isinstance(r, NotSent):
                unsent.append(i)
                if g is not None:
                    stalled.add(g)
            elif g is not None and g in stalled:
                raise SinkContractError(f"message {i} was sent after an earlier message of its group that was not")
            elif g is not None and g in self._failed:
                self._settle(i, HELD)  # sent past its group's failure (pipelined): parked behind it anyway
            else:
                self._settle(i, r)
                if r is not None and g is not None:
                    self._failed.add(g)
        if call and len(unsent) == len(call):
            raise SinkContractError("the sink attempted none of the messages it was handed")
        if self.one_per_group:
            for i in unsent:
                g = self.groups[i]
                if g is None:
                    self._ungrouped.append(i)
                else:  # back in front of its group: nothing of the group goes before it
                    self._queues.setdefault(g, deque()).appendleft(i)
        else:
            self._pending = unsent

    def give_up(self, call: Sequence[int], reason: str) -> None:
        """The destination went away after part of the batch was acknowledged: what is left fails with
        `reason` (each group's first such message; its later ones are held behind it)."""
        left = sorted([*call, *self._pending, *self._ungrouped, *(i for q in self._queues.values() for i in q)])
        self._pending, self._ungrouped, self._queues = [], [], {}
        for i in left:
            if not self._hold(i):
                self._settle(i, reason)
                g = self.groups[i]
                if g is not None:
                    self._failed.add(g)

    def outcome(self) -> list[str | None]:
        """One result per message: None (delivered), the message's own error, or HELD."""
        if any(r is _UNDECIDED for r in self.results):
            raise SinkContractError("the batch is not settled yet")
        return self.results

    def _hold(self, i: int) -> bool:
        g = self.groups[i]
        if g is not None and g in self._failed:
            self._settle(i, HELD)
            return True
        return False

    def _settle(self, i: int, result: str | None) -> None:
        self.results[i] = result
        if result is None:
            self.delivered += 1
        else:
            self.parked.append(i)
