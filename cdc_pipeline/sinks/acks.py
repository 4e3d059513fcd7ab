"""Publishes settled as the broker acknowledges them, for sinks that publish a call back to back (NATS PubAck,
RabbitMQ publisher confirms), which differ only in how an acknowledgement maps back to a message.

What goes out and when is the scheduler's (delivery/schedule/): such a sink's calls are not `ordered` (it
publishes before the earlier messages are acknowledged), so it is handed at most one message per group per
call, one call at a time, at most the sink's `batch_size` messages: the whole call is published at once and
its acknowledgements gathered. A lost connection ends the wait at once; the next call reconnects.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc_pipeline.sinks.base import (
    EventLoopThread,
    Limits,
    OutboundMessage,
    Sink,
    SinkUnavailable,
    Unreachable,
)

PENDING = "\x00pending"  # placeholder result; never returned (compared by identity)


@dataclass(eq=False)
class Acks:
    """One call's results as the acknowledgements come."""

    results: list[str | None]
    outstanding: int = 0  # published, not acknowledged yet
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # set when the last one is acknowledged
    lost: str | None = None  # why the connection went away mid-call

    def settle(self, index: int, result: str | None) -> None:
        self.results[index] = result
        self.outstanding -= 1
        if self.outstanding <= 0:
            self.progress.set()

    def lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            self.progress.set()

    async def wait(self, timeout_s: float) -> None:
        """Until every publish is settled, the connection is lost, or acknowledgements stopped coming for
        `timeout_s` (measured from the last one: a long call is not cut short while they still flow)."""
        while self.outstanding > 0 and self.lost is None:
            before = self.outstanding
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), timeout_s)
            except TimeoutError:
                if self.outstanding >= before:
                    return

    def final(self, unsettled: str) -> list[str | None]:
        """Results, with messages never settled reported as `unsettled` (or the loss)."""
        why = Unreachable(f"not delivered: {self.lost}" if self.lost is not None else unsettled)
        return [why if r is PENDING else r for r in self.results]


class PublishingSink(Sink):
    """A sink whose asyncio client publishes a call ahead of its acknowledgements on a private loop."""

    kind: str  # for messages: "nats", "rabbitmq"
    _runner: EventLoopThread | None

    def __init__(self) -> None:
        self._runner = None

    @abc.abstractmethod
    def _connect(self) -> Coroutine[Any, Any, None]:
        """Connect and declare what the destination needs; raises SinkUnavailable when unreachable."""

    @abc.abstractmethod
    def _usable(self) -> bool:
        """Whether the connection can take a call (else deliver reconnects first)."""

    @abc.abstractmethod
    def _publish(self, batch: Sequence[OutboundMessage]) -> Coroutine[Any, Any, tuple[list[str | None], str | None]]:
        """Publish; returns per-message results and why the connection was lost (None if it was not)."""

    def limits(self) -> Limits:
        return Limits(ordered=False)  # publishes ahead of acknowledgements

    def open(self) -> None:
        if self._runner is None:
            self._runner = EventLoopThread(f"{self.kind}-sink-{self.name}")
        try:
            self._runner.run(self._connect())
        except BaseException:
            self.close()
            raise

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        if not batch:
            return []
        if not self._usable():
            self.close()
            self.open()
        assert self._runner is not None
        results, lost = self._runner.run(self._publish(batch))
        if lost is not None and not any(r is None for r in results):
            raise SinkUnavailable(f"{self.kind} sink {self.name!r}: {lost}")
        return results
