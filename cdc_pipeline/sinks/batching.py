"""A sink whose destination takes batch requests with a result per entry (SQS, SNS, Kinesis, Typesense).

A call (sinks/request_sink.py: the scheduler's, at most one message per group since the sink's calls are not
`ordered`) is encoded, checked against the destination's limits and cut into requests (batch_plan.py); the
requests of a call go to their targets together. Each entry's result is its message's result: an entry the
destination rejects fails alone (parked by the engine, its group held), an entry it could not take for
reasons of its own (throttled, an internal error) is `Unreachable`. A request refused as a whole for a
reason that speaks for the destination (throttling, 5xx, credentials, nothing listening) is an outage: the
call says so and the scheduler sends nothing more; with nothing acknowledged the batch is retried later.

The client is asyncio (aiobotocore, httpx) on the sink's own event loop thread (base.EventLoopThread).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from typing import Any, NamedTuple

from cdc_pipeline.core.findings import Finding
from cdc_pipeline.sinks.base import (
    EventLoopThread,
    Limits,
    OutboundMessage,
    SinkConfigLike,
    SinkUnavailable,
    Unreachable,
)
from cdc_pipeline.sinks.batch_plan import RequestLimits, plan_requests
from cdc_pipeline.sinks.request_sink import RequestSink, Sent

_PENDING = "\x00pending"  # placeholder result; never returned (compared by identity)
MAX_IN_FLIGHT = 10  # requests out at once by default


class DestinationDown(Exception):
    """The destination as a whole did not take a request (throttled, 5xx, refused credentials, unreachable).
    Its text is shown to operators: never a secret."""


class Encoded(NamedTuple):
    target: str  # where the entry goes (a queue, topic, stream or collection): one request per target
    entry: Any  # the request entry
    size: int  # its size as the destination counts it against its limits


class BatchingSink(RequestSink):
    kind: str  # for messages: "sqs", "kinesis", ...
    request_limits: RequestLimits

    def __init__(self, name: str) -> None:
        self.name = name
        self._runner: EventLoopThread | None = None
        self._connected = False

    # -- what a destination implements --------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, message: OutboundMessage) -> Encoded | str:
        """The request entry of a message, or why it cannot be sent (its own failure: a refused route)."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Build the client and check the destination answers; raises DestinationDown when it does not."""

    @abc.abstractmethod
    async def disconnect(self) -> None:
        """Release the client (best effort)."""

    @abc.abstractmethod
    async def send_request(self, target: str, entries: Sequence[tuple[OutboundMessage, Any]]) -> list[str | None]:
        """Send one request of entries to `target`; a result per entry (None, an error, or Unreachable).
        Raises DestinationDown."""

    # -- capabilities (sinks/base.py) -----------------------------------------------------------------
    @classmethod
    def check_findings(cls, sink_config: SinkConfigLike) -> list[Finding]:
        """Connects as a delivery would: the service answers, takes the credentials, and the configured
        queue, topic, stream or key works; plus what the sink type says of its config (`config_findings`)."""
        where = f"sink {sink_config.name}"
        out = [Finding("warning", where, text) for text in cls.config_findings(sink_config)]
        sink = cls(sink_config)  # type: ignore[call-arg]  # every batching sink is built from its config
        try:
            sink.open()
        except SinkUnavailable as exc:
            return [*out, Finding("error", where, f"{exc} (delivery waits until this is fixed)")]
        finally:
            sink.close()
        return out

    @classmethod
    def config_findings(cls, sink_config: SinkConfigLike) -> list[str]:
        """Warnings about the configuration itself (a standard queue keeps no order)."""
        return []

    # -- lifecycle ----------------------------------------------------------------------------------
    def open(self) -> None:
        if self._runner is None:
            self._runner = EventLoopThread(f"{self.kind}-sink-{self.name}")
        try:
            self._runner.run(self.connect())
        except DestinationDown as exc:
            self.close()
            raise SinkUnavailable(f"{self.kind} sink {self.name!r}: {exc}") from None
        except BaseException:
            self.close()
            raise
        self._connected = True

    def close(self) -> None:
        runner, self._runner, self._connected = self._runner, None, False
        if runner is None:
            return
        try:
            runner.run(self.disconnect(), timeout=10)
        except Exception:  # noqa: S110 - closing is best effort: the loop is torn down next anyway
            pass
        finally:
            runner.stop()

    # -- delivery -----------------------------------------------------------------------------------
    def limits(self) -> Limits:
        return Limits(batch_size=self.request_limits.max_entries, max_in_flight=MAX_IN_FLIGHT, ordered=False)

    def loop(self) -> EventLoopThread:
        if not self._connected:
            self.open()
        assert self._runner is not None
        return self._runner

    async def send(self, batch: Sequence[OutboundMessage]) -> Sent:
        encoded = [self.encode(m) for m in batch]
        results: list[str | None] = [_PENDING] * len(batch)
        plan = plan_requests([e if isinstance(e, str) else e.size for e in encoded], self.request_limits)
        for i, why in plan.refused.items():
            results[i] = why
        down: list[str] = []

        async def to_target(target: str, request: list[int]) -> None:
            try:
                outcome = await self.send_request(target, [(batch[i], _entry(encoded[i])) for i in request])
            except DestinationDown as exc:
                down.append(str(exc))
                outcome = [Unreachable(f"not delivered: {exc}")] * len(request)
            for i, r in zip(request, outcome, strict=True):
                results[i] = r

        for request in plan.requests:  # one message per group in the call: the requests' order is free
            if down:
                break
            by_target: dict[str, list[int]] = {}
            for i in request:
                by_target.setdefault(_entry(encoded[i], target=True), []).append(i)
            await asyncio.gather(*(to_target(t, idx) for t, idx in by_target.items()))
        if down:
            results = [Unreachable(f"not sent: {down[0]}") if r is _PENDING else r for r in results]
        return Sent(results, down[0] if down else None)


def _entry(e: Encoded | str, target: bool = False) -> Any:
    assert not isinstance(e, str)  # refused messages are in no request
    return e.target if target else e.entry
