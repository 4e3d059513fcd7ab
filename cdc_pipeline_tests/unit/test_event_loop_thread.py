"""The sinks' private event loop (asyncio.Runner on a thread): results and errors come back to the caller, a
timeout cancels the coroutine, and stop cancels the client's own background tasks and ends the thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cdc_pipeline.sinks.base import EventLoopThread
from cdc_pipeline_tests.helpers import wait_until


def test_results_errors_timeouts_and_stop() -> None:
    before = threading.active_count()
    runner = EventLoopThread("test-sink-loop")
    cancelled: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append("background")
            raise

    async def work(x: int) -> int:
        asyncio.get_running_loop().create_task(background())  # as a client's reader task would
        return x * 2

    async def slow() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append("slow")
            raise

    async def fail() -> None:
        raise ValueError("refused")

    assert runner.run(work(21)) == 42
    with pytest.raises(ValueError, match="refused"):
        runner.run(fail())
    with pytest.raises(TimeoutError):
        runner.run(slow(), timeout=0.05)
    stopper = threading.Thread(target=lambda: (runner.stop(), runner.stop()))  # idempotent
    stopper.start()
    stopper.join(60)
    assert not stopper.is_alive(), "stop() hung"
    assert sorted(cancelled) == ["background", "slow"]
    wait_until(lambda: threading.active_count() == before, 60, "the loop's thread to end")
    with pytest.raises(RuntimeError, match="stopped"):
        runner.run(work(1))
