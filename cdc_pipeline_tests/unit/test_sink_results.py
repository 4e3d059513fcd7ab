"""A sink's results for a prefix of its call (sinks/base.py contract; delivery/schedule/order.py `answered`): the
messages past the end of the list are not attempted, and the scheduler hands back those whose group is still in
order; a list longer than the call is the sink's error, named."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD, SinkContractError
from cdc_pipeline.sinks.base import EventLoopThread, Limits, OutboundMessage, Sink
from cdc_pipeline.sinks.request_sink import RequestSink, Sent

# (group, accepted): b's first message is refused, so b's second is held; a and c flow.
BATCH = [("a", True), ("b", False), ("a", True), ("c", True), ("b", True)]


def messages() -> list[OutboundMessage]:
    return [OutboundMessage(f"{100 + i}:0", g, None, b"{}") for i, (g, _) in enumerate(BATCH)]


def answer(batch: Sequence[OutboundMessage], extra: int) -> list[str | None]:
    """Up to and including the first refused message, then nothing (a prefix); `extra` results too many."""
    results: list[str | None] = []
    for m in batch:
        results.append(None if BATCH[int(m.key.split(":")[0]) - 100][1] else f"refused {m.key}")
        if results[-1] is not None:
            break
    return results + [None] * extra


class Sequential(Sink):
    name = "sequential"

    def __init__(self, extra: int = 0) -> None:
        self.extra = extra
        self.calls: list[list[str]] = []

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        self.calls.append([m.key for m in batch])
        return answer(batch, self.extra)


class Requested(RequestSink):
    name = "requested"

    def __init__(self, extra: int = 0) -> None:
        self.extra = extra
        self.calls: list[list[str]] = []
        self._runner = EventLoopThread("test-prefix")

    def limits(self) -> Limits:
        return Limits(batch_size=len(BATCH))

    def loop(self) -> EventLoopThread:
        return self._runner

    async def send(self, batch: Sequence[OutboundMessage]) -> Sent:
        await asyncio.sleep(0)
        self.calls.append([m.key for m in batch])
        return Sent(answer(batch, self.extra))

    def close(self) -> None:
        self._runner.stop()


@pytest.mark.parametrize("kind", [Sequential, Requested])
def test_a_sink_answering_for_a_prefix_gets_the_rest_whose_group_is_in_order_next(kind: type) -> None:
    sink = kind()
    try:
        outcome = deliver_in_order(sink, messages())
    finally:
        sink.close()
    assert outcome == [None, "refused 101:0", None, None, HELD]
    # the first call up to the refusal; then what follows it but b's later message, which is never sent
    assert sink.calls == [["100:0", "101:0", "102:0", "103:0", "104:0"], ["102:0", "103:0"]]


@pytest.mark.parametrize("kind", [Sequential, Requested])
def test_more_results_than_messages_is_the_sinks_error_named(kind: type) -> None:
    sink = kind(extra=len(BATCH))
    try:
        with pytest.raises(SinkContractError, match=rf"sink '{sink.name}' returned \d+ results for a call of 5"):
            deliver_in_order(sink, messages())
    finally:
        sink.close()
