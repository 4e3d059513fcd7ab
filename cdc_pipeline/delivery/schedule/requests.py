"""The calls of a request sink (sinks/request_sink.py): what the scheduler delivers cut into requests of the
sink's `batch_size`, up to its `max_in_flight` out at once on the sink's event loop (shared by the calls of the
window out together, window.py), never a group out of order.

A request waits until the previous request holding any of its groups has returned, so a group's later message
is sent only after its earlier one was acknowledged. A request one of whose groups stalled (a message not
acknowledged: failed or not sent) is not sent at all, and its groups stall in turn: reported NOT_SENT, the
dispatcher hands back what may still follow (dispatch.py). A request the sink answered for a prefix of only has
the rest NOT_SENT (order.py `answered`). Ungrouped messages wait for nothing. A message the
sink sends `alone` waits for every earlier request, and every later one waits for it. Once a request says the
destination is down nothing more goes out until the requests beside it are back: if none of them was
acknowledged it is down (what is left is not sent), else that request went unanswered and the rest go.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence

from cdc_pipeline.delivery.schedule.order import answered
from cdc_pipeline.sinks.base import NOT_SENT, OutboundMessage, SinkUnavailable, Unreachable
from cdc_pipeline.sinks.request_sink import RequestSink

_PENDING = "\x00pending"  # placeholder result; never returned (compared by identity)


class Stopped(SinkUnavailable):
    """The run is stopping: the requests of a call not sent yet were not sent (the next run sends the call)."""


class Requests:
    def __init__(self, sink: RequestSink, batch_size: int, max_in_flight: int,
                 stop: threading.Event | None = None) -> None:
        self.sink = sink
        self.stop = stop  # set: nothing more goes out (what is out finishes)
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._opening = threading.Lock()  # calls out at once from the window's threads: one opens the sink

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        """One result per message, as `Sink.deliver`; raises SinkUnavailable when the destination is down and
        nothing was acknowledged. Thread-safe: calls out at once share the sink's `max_in_flight`."""
        if not batch:
            return []
        with self._opening:
            runner = self.sink.loop()
        results, down, stopped = runner.run(self._send(batch))
        if stopped:
            raise Stopped("the run is stopping: part of a call was not sent")
        if down is not None and not any(r is None for r in results):
            raise SinkUnavailable(down)
        return results

    async def _send(self, batch: Sequence[OutboundMessage]) -> tuple[list[str | None], str | None, bool]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._slots is None:  # first use, or the sink reopened on a new loop
            self._loop, self._slots = loop, asyncio.Semaphore(self.max_in_flight)
        results: list[str | None] = [_PENDING] * len(batch)
        live = _Liveness(self.stop)

        async def send(chunk: range) -> set[str]:
            began = live.sending()
            try:
                sent = await self.sink.send(batch[chunk.start:chunk.stop])
            finally:
                live.returned()
            got = answered(sent.results, len(chunk), self.sink.name)
            results[chunk.start:chunk.stop] = got
            if all(r is None for r in got):  # the usual request: every message acknowledged
                live.acked()
                return set()
            if any(r is None for r in got):
                live.acked()
            if sent.down is not None:
                live.suspect(began, sent.down)
            return {g for i in chunk if results[i] is not None and (g := batch[i].group) is not None}

        def skip(chunk: range) -> None:
            for i in chunk:
                results[i] = Unreachable(f"not sent: {live.down}") if live.down is not None else NOT_SENT  # stopped: NOT_SENT

        alone = self.sink.alone if type(self.sink).alone is not RequestSink.alone else None
        chunks, barriers = cut(len(batch), self.batch_size, [i for i, m in enumerate(batch) if alone(m)] if alone else [])
        await window(chunks, barriers, [m.group for m in batch], self._slots, send, skip, live.halted)
        await live.is_down()  # every request is back: a request that said so is judged now
        return results, live.down, live.stopped


class _Liveness:
    """Whether the destination is down, for the requests of one call: a request that says so (`Sent.down`) is
    believed once the requests out beside it are back and none was acknowledged since it began; until then
    nothing more goes out. Else its messages went unanswered (their own failure), as delivery/outage.py tells
    across calls."""

    def __init__(self, stop: threading.Event | None) -> None:
        self.down: str | None = None
        self.stopped = False  # a request was not sent because the run is stopping
        self._stop = stop
        self._acked = 0  # requests with a message acknowledged
        self._out = 0  # requests out
        self._suspects: list[tuple[int, str]] = []  # (acknowledged before it began, why) of requests saying down
        self._changed = asyncio.Event()

    def sending(self) -> int:
        self._out += 1
        return self._acked

    def returned(self) -> None:
        self._out -= 1
        self._changed.set()

    def acked(self) -> None:
        self._acked += 1

    def suspect(self, began: int, why: str) -> None:
        self._suspects.append((began, why))

    async def halted(self) -> bool:
        """Whether nothing more goes out: the run is stopping, or the destination is down."""
        if self._stop is not None and self._stop.is_set():
            self.stopped = True
            return True
        return await self.is_down()

    async def is_down(self) -> bool:
        while self.down is None and self._suspects:
            began, why = self._suspects[0]
            if self._acked > began:  # acknowledged since it began: the destination is up
                self._suspects.pop(0)
            elif not self._out:
                self.down = why
            else:
                self._changed.clear()
                await self._changed.wait()
        return self.down is not None


def cut(n: int, size: int, alone: Sequence[int]) -> tuple[list[range], set[int]]:
    """Requests of at most `size` of `n` messages, in order, and which of them are a message that goes alone
    (`alone`: their indexes, ascending)."""
    chunks: list[range] = []
    barriers: set[int] = set()
    start = 0
    for at in [*alone, n]:
        chunks += [range(i, min(i + size, at)) for i in range(start, at, size)]
        if at < n:
            barriers.add(len(chunks))
            chunks.append(range(at, at + 1))
        start = at + 1
    return chunks, barriers


async def window(chunks: Sequence[range], barriers: set[int], groups: Sequence[str | None],
                 slots: asyncio.Semaphore, send: Callable[[range], Awaitable[set[str]]],
                 skip: Callable[[range], None], halted: Callable[[], Awaitable[bool]]) -> None:
    """Send `chunks` through `slots` (see the module doc). `send` posts one chunk and returns the groups of its
    messages not acknowledged; `skip` reports a chunk not sent (a group of it stalled, or `halted()`)."""
    stalled: set[str] = set()

    async def one(chunk: range, own: set[str], before: list[asyncio.Task[None]]) -> None:
        for task in before:
            if not task.done():
                with contextlib.suppress(Exception):  # its outcome is in `stalled`; its error, its own
                    await task
        if await halted() or not stalled.isdisjoint(own):
            stalled.update(own)
            skip(chunk)
            return
        async with slots:
            if await halted() or not stalled.isdisjoint(own):  # settled while this one waited for a slot
                stalled.update(own)
                skip(chunk)
                return
            stalled.update(await send(chunk))

    last: dict[str, asyncio.Task[None]] = {}  # each group's latest chunk
    tasks: list[asyncio.Task[None]] = []
    barrier: list[asyncio.Task[None]] = []  # the latest chunk that went alone: every later one waits for it
    since: list[asyncio.Task[None]] = []  # the chunks since it: the next one alone waits for them
    for k, chunk in enumerate(chunks):
        own = {g for i in chunk if (g := groups[i]) is not None}
        if k in barriers:
            before = [*barrier, *since]
        else:
            before = [*barrier, *{id(t): t for g in own if (t := last.get(g)) is not None}.values()]
        task = asyncio.ensure_future(one(chunk, own, before))
        for g in own:
            last[g] = task
        tasks.append(task)
        if k in barriers:
            barrier, since = [task], []
        else:
            since.append(task)
    try:
        await asyncio.gather(*tasks)
    finally:  # a failure (or the caller's cancellation) must not leave requests going out behind it
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
