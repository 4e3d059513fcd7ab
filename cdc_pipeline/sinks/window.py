"""A sliding window of requests for sinks whose cost is latency (issue 23): chunks of a call in flight while
`slots` allows (a semaphore the sink shares between concurrent calls), the next one going as soon as any
returns, never a group out of order.

A chunk waits until the previous chunk holding any of its groups has returned (acknowledged or not), so
a group's later message is sent only after its earlier one was acknowledged. A chunk one of whose groups
stalled (a message not acknowledged: failed or not sent) is not sent at all, and its groups stall in turn:
the sink reports it not sent and the engine hands back what may still follow (delivery/schedule/). Ungrouped
messages (group None) wait for nothing. Runs on the sink's event loop; the sending itself is the sink's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence


async def send_window(chunks: Sequence[Sequence[int]], groups: Sequence[str | None], slots: asyncio.Semaphore,
                      send: Callable[[Sequence[int]], Awaitable[set[str]]],
                      skip: Callable[[Sequence[int]], None], halted: Callable[[], bool]) -> None:
    """Send `chunks` (message indexes, in batch order) through the window's `slots`. `send` posts
    one chunk and returns the groups of its messages not acknowledged; `skip` reports a chunk not sent
    (a group of it stalled, or `halted()`: the destination is down)."""
    stalled: set[str] = set()
    last: dict[str, asyncio.Task[None]] = {}  # each group's latest chunk

    async def one(chunk: Sequence[int], own: set[str], before: list[asyncio.Task[None]]) -> None:
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

    tasks: list[asyncio.Task[None]] = []
    for chunk in chunks:
        own = {g for i in chunk if (g := groups[i]) is not None}
        before = list({id(t): t for g in own if (t := last.get(g)) is not None}.values())
        task = asyncio.ensure_future(one(chunk, own, before))
        for g in own:
            last[g] = task
        tasks.append(task)
    try:
        await asyncio.gather(*tasks)
    finally:  # a failure (or the caller's cancellation) must not leave requests going out behind it
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
