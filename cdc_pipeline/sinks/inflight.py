"""Bookkeeping for sinks that pipeline their publishes and settle them as the broker acknowledges.

Pipelining is across groups only: such a sink's calls are not `ordered` (its `Limits`), so the engine hands it at most one
message per group per call and a group's next message is published once the previous one is
acknowledged (9.15).

The publisher sends up to a window of messages ahead, then waits for acknowledgements to bring the
count down; a lost connection wakes it at once. Shared by the NATS (PubAck) and RabbitMQ (publisher
confirm) sinks, which differ only in how an acknowledgement maps back to a message.
"""

from __future__ import annotations

import abc
import asyncio
import threading
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
class InFlight:
    results: list[str | None]
    outstanding: int = 0
    wake_at: int = 0  # wake the publisher when outstanding drops to this
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    lost: str | None = None  # why the connection went away mid-batch

    def settle(self, index: int, result: str | None) -> None:
        self.results[index] = result
        self.outstanding -= 1
        if self.outstanding <= self.wake_at:
            self.progress.set()

    def lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            self.progress.set()

    async def wait(self, target: int, timeout_s: float) -> bool:
        """Wait until at most `target` publishes are unsettled; False if settlements stopped coming for
        `timeout_s` or the connection was lost."""
        while self.outstanding > target and self.lost is None:
            before = self.outstanding
            self.wake_at = target
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), timeout_s)
            except TimeoutError:
                if self.outstanding >= before:
                    return False
        return self.lost is None

    def final(self, unsettled: str) -> list[str | None]:
        """Results, with messages never settled reported as `unsettled` (or the loss)."""
        why = Unreachable(f"not delivered: {self.lost}" if self.lost is not None else unsettled)
        return [why if r is PENDING else r for r in self.results]


class PipelinedSink(Sink):
    """A sink whose asyncio client publishes a batch ahead of its acknowledgements on a private loop."""

    kind: str  # for messages: "nats", "rabbitmq"
    _runner: EventLoopThread | None

    def __init__(self) -> None:
        self._runner = None
        self._lock = threading.Lock()  # one deliver() at a time: acks are matched to the batch in flight

    @abc.abstractmethod
    def _connect(self) -> Coroutine[Any, Any, None]:
        """Connect and declare what the destination needs; raises SinkUnavailable when unreachable."""

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

    @abc.abstractmethod
    def _usable(self) -> bool:
        """Whether the connection can take a batch (else deliver reconnects first)."""

    @abc.abstractmethod
    def _publish(self, batch: Sequence[OutboundMessage]) -> Coroutine[Any, Any, tuple[list[str | None], str | None]]:
        """Publish; returns per-message results and why the connection was lost (None if it was not)."""

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        if not batch:
            return []
        with self._lock:
            if not self._usable():
                self.close()
                self.open()
            assert self._runner is not None
            results, lost = self._runner.run(self._publish(batch))
        if lost is not None and not any(r is None for r in results):
            raise SinkUnavailable(f"{self.kind} sink {self.name!r}: {lost}")
        return results
