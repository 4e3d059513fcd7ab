"""The calls of a request sink (sinks/request_sink.py): what the scheduler delivers cut into requests of the
sink's `batch_size`, up to its `max_in_flight` out at once on the sink's event loop (shared by the calls of the
window out together, window.py), never a group out of order.

A request waits until the previous request holding any of its groups has returned, so a group's later message
is sent only after its earlier one was acknowledged. A request one of whose groups stalled (a message not
acknowledged: failed or not sent) is not sent at all, and its groups stall in turn: reported NOT_SENT, the
dispatcher hands back what may still follow (dispatch.py). Ungrouped messages wait for nothing. A message the
sink sends `alone` waits for every earlier request, and every later one waits for it. Once the destination is
down nothing more goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence

from cdc_pipeline.sinks.base import NOT_SENT, OutboundMessage, SinkUnavailable, Unreachable
from cdc_pipeline.sinks.request_sink import RequestSink

_PENDING = "\x00pending"  # placeholder result; never returned (compared by identity)


class Requests:
    def __init__(self, sink: RequestSink, batch_size: int, max_in_flight: int) -> None:
        self.sink = sink
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
        results, down = runner.run(self._send(batch))
        if down is not None and not any(r is None for r in results):
            raise SinkUnavailable(down)
        return results

    async def _send(self, batch: Sequence[OutboundMessage]) -> tuple[list[str | None], str | None]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._slots is None:  # first use, or the sink reopened on a new loop
            self._loop, self._slots = loop, asyncio.Semaphore(self.max_in_flight)
        results: list[str | None] = [_PENDING] * len(batch)
        down: list[str] = []

        async def send(chunk: range) -> set[str]:
            sent = await self.sink.send(batch[chunk.start:chunk.stop])
            results[chunk.start:chunk.stop] = sent.results
            if sent.down is not None:
                down.append(sent.down)
            if all(r is None for r in sent.results):  # the usual request: every message acknowledged
                return set()
            return {g for i in chunk if results[i] is not None and (g := batch[i].group) is not None}

        def skip(chunk: range) -> None:
            for i in chunk:
                results[i] = Unreachable(f"not sent: {down[0]}") if down else NOT_SENT

        alone = self.sink.alone if type(self.sink).alone is not RequestSink.alone else None
        chunks, barriers = cut(len(batch), self.batch_size, [i for i, m in enumerate(batch) if alone(m)] if alone else [])
        await window(chunks, barriers, [m.group for m in batch], self._slots, send, skip, lambda: bool(down))
        return results, (down[0] if down else None)


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
                 skip: Callable[[range], None], halted: Callable[[], bool]) -> None:
    """Send `chunks` through `slots` (see the module doc). `send` posts one chunk and returns the groups of its
    messages not acknowledged; `skip` reports a chunk not sent (a group of it stalled, or `halted()`)."""
    stalled: set[str] = set()

    async def one(chunk: range, own: set[str], before: list[asyncio.Task[None]]) -> None:
        for task in before:
            if not task.done():
                with contextlib.suppress(Exception):  # its outcome is in `stalled`; its error, its own
                    await task
        if halted() or not stalled.isdisjoint(own):
            stalled.update(own)
            skip(chunk)
            return
        async with slots:
            if halted() or not stalled.isdisjoint(own):  # settled while this one waited for a slot
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
