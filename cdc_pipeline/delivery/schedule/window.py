"""The engine's window (issue 23): up to `width` calls to a sink outstanding at once, across micro-batches,
a group's later message never sent before its earlier one's outcome is known, calls settled in log order.

A call whose groups have no message in flight goes at once. Messages of a group that has one in flight go
in a second part of the call, which waits for the calls it depends on: then it knows which of its groups
failed there and holds their messages back (ordering.py `split_held`, the same rule as for a group with a
parked message). So what a sink sees of each group is exactly what a call-at-a-time engine would hand it,
while other groups flow. Calls are settled in order, by the caller, so the offset moves over the
contiguous prefix of settled calls and never past a message whose outcome is unknown.

A width of 1 (a sink that takes one call at a time) sends in the caller's thread: no thread, no change.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field

from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.schedule.calls import Call
from cdc_pipeline.delivery.schedule.order import position_of, split_held
from cdc_pipeline.delivery.schedule.requests import Stopped
from cdc_pipeline.sinks.base import OutboundMessage, SinkUnavailable, Unreachable

UNSETTLED_CALLS = 4  # calls done but not settled yet (behind a slower earlier one), in units of the width

# Send: messages in order and the earliest position the engine keeps back -> one result per message.
Send = Callable[[Sequence[OutboundMessage], Position | None], list[str | None]]


class Abandoned(Exception):
    """A part was not sent: an earlier call failed as a whole, and the window is being given up."""


@dataclass
class Part:
    """What one part of a call sent and held back, and the sink's results."""

    sent: list[OutboundMessage]
    held: list[OutboundMessage]
    results: list[str | None]
    down: SinkUnavailable | None = None  # the sink found the destination down: `sent` all unanswered


@dataclass(eq=False)
class Outstanding:
    call: Call
    parts: list[Future[Part]]
    began: float = field(default_factory=time.monotonic)

    def done(self) -> bool:
        return all(p.done() for p in self.parts)

    def outcome(self) -> Part:
        """The parts merged (`down`: the first one's); raises a part's error."""
        merged = Part([], [], [])
        for future in self.parts:
            part = future.result()
            merged.sent += part.sent
            merged.results += part.results
            merged.held += part.held
            merged.down = merged.down or part.down
        return merged


class Workers:
    """`width` threads taking jobs in order, started by a thread of their own. concurrent.futures starts a
    thread per submit until it has them all, and a submit then waits for its thread to start: under load (a
    block staging, the sink's loop busy) that is up to a GIL switch interval each, ~0.1-0.2 s of the
    caller's time for a window of 100 (measured)."""

    def __init__(self, width: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Part], Callable[[], Part]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(width)]
        self._starter = threading.Thread(target=lambda: [t.start() for t in self._threads], daemon=True)
        self._starter.start()

    def submit(self, job: Callable[[], Part]) -> Future[Part]:
        future: Future[Part] = Future()
        self._jobs.put((future, job))
        return future

    def shutdown(self) -> None:
        """Let the jobs taken finish, and the threads end."""
        self._starter.join()
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, job = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever settles the call
                future.set_exception(exc)


class CallWindow:
    def __init__(self, send: Send, width: int, max_messages: int) -> None:
        self._send = send
        self.width = width
        self.max_messages = max_messages  # memory: messages outstanding at once, at most (one more call may go)
        self._pool = Workers(width, "deliver-call") if width > 1 else None
        self._lock = threading.Lock()  # _blocked, shared with the parts
        self._queue: deque[Outstanding] = deque()
        self._blocked: set[str] = set()  # groups with a parked or failed message: their later ones are held
        self._failures: list[tuple[Position, str | None]] = []  # stage failures: their groups' later ones held
        self._last: dict[str, Future[Part]] = {}  # each group's latest part
        self._broken = False
        self.opened = 0.0  # when the window last went from empty to busy
        self._messages = 0  # messages of the calls not settled yet
        self._done = threading.Condition()  # a part finished: _out and _completed changed
        self._out = 0  # parts not finished
        self._completed = 0  # parts finished, ever

    def __len__(self) -> int:
        return len(self._queue)

    def reset(self, parked_groups: set[str | None]) -> None:
        """Start afresh (the window is empty) from the groups parked in the state database."""
        assert not self._queue
        self._blocked = {g for g in parked_groups if g is not None}
        self._failures = []
        self._last = {}
        self._broken = False

    def full(self, call: Call) -> bool:
        """Whether what waits to be settled leaves no room for `call` (UNSETTLED_CALLS times `width` calls, or
        `max_messages` messages): only settling the head makes room."""
        return bool(self._queue) and (len(self._queue) >= UNSETTLED_CALLS * self.width
                                      or self._messages + len(call.messages) > self.max_messages)

    def room(self, call: Call) -> bool:
        """Whether `call` may go now: fewer than `width` parts of calls still out, and not `full`."""
        return not self._queue or (self._out < self.width and not self.full(call))

    def submit(self, call: Call) -> None:
        """Start `call` (the caller made `room` for it)."""
        if not self._queue:
            self.opened = time.monotonic()
        self._failures += [(pos, g) for pos, g, _ in call.stage_failed]
        failures = list(self._failures)
        free: list[OutboundMessage] = []
        waiting: list[OutboundMessage] = []
        deps: dict[int, Future[Part]] = {}
        waits: dict[str, bool] = {}  # per group, decided once: a part finishing meanwhile must not split it
        for m in call.messages:
            g = m.group
            if g is not None and g not in waits:
                before = self._last.get(g)
                waits[g] = before is not None and not before.done()
                if waits[g]:
                    deps[id(before)] = before
            (waiting if g is not None and waits[g] else free).append(m)
        kept = [pos for pos, _, _ in call.stage_failed]
        parts: list[Future[Part]] = []
        for msgs, after in ((free, []), (waiting, list(deps.values()))):
            if not msgs:
                continue
            with self._done:
                self._out += 1
            part = self._start(msgs, after, failures, kept)
            part.add_done_callback(self._finished)
            for m in msgs:
                if m.group is not None:
                    self._last[m.group] = part
            parts.append(part)
        self._queue.append(Outstanding(call, parts))
        self._messages += len(call.messages)

    def make_room(self, call: Call) -> list[Outstanding]:
        """One wait towards room for `call`: for the head when only settling makes room, else until any part
        out is done. Returns the calls settled at the head meanwhile (maybe none), for the caller to settle."""
        if self.full(call):
            return self.settled(block=True)
        with self._done:
            seen = self._completed
            self._done.wait_for(lambda: self._completed != seen or not self._out)
        return []

    def settled(self, block: bool) -> list[Outstanding]:
        """The calls at the head whose outcome is known, in order (with `block`: at least the head's)."""
        if block and self._queue:
            head = self._queue[0]
            with self._done:
                self._done.wait_for(head.done)
        ready: list[Outstanding] = []
        while self._queue and self._queue[0].done():
            ready.append(self._queue.popleft())
            self._messages -= len(ready[-1].call.messages)
        return ready

    def wait_out(self) -> None:
        """Until no part is out."""
        with self._done:
            self._done.wait_for(lambda: not self._out)

    def _finished(self, _: Future[Part]) -> None:
        with self._done:
            self._out -= 1
            self._completed += 1
            self._done.notify_all()

    def abandon(self) -> None:
        """Give up what is outstanding: nothing more is sent, what is out is waited for, nothing settled."""
        self._broken = True
        for o in self._queue:
            wait_all(o.parts)
        self._queue.clear()
        self._messages = 0

    def close(self) -> None:
        self.abandon()
        if self._pool is not None:
            self._pool.shutdown()

    def _start(self, messages: list[OutboundMessage], after: list[Future[Part]],
               failures: list[tuple[Position, str | None]], kept: list[Position]) -> Future[Part]:
        def run() -> Part:
            for dep in after:  # their outcome (failed groups) is in _blocked once they are done
                if dep.exception() is not None:
                    raise Abandoned("an earlier call of the same groups failed")
            if self._broken:
                raise Abandoned("the window was given up")
            with self._lock:
                blocked = set(self._blocked)
            send, held = split_held(messages, blocked, failures)
            keep = kept + [position_of(m) for m in held]
            down = None
            try:
                results = self._send(send, min(keep) if keep else None)
            except Stopped:  # the run stops mid-call (requests.py): not settled, settle.py stops before it
                raise
            except SinkUnavailable as exc:  # an outage, unless other calls got through meanwhile (the caller's)
                results, down = [Unreachable(f"not delivered: {exc}")] * len(send), exc
            failing = {m.group for m, r in zip(send, results, strict=True) if r is not None and m.group is not None}
            failing |= {m.group for m in held if m.group is not None}
            with self._lock:  # before this part counts as done: a later call reads it
                self._blocked |= failing
            return Part(send, held, results, down)

        if self._pool is not None:
            return self._pool.submit(run)
        future: Future[Part] = Future()
        try:
            future.set_result(run())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever settles the call
            future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        return future
