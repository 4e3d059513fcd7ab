"""A sink whose destination takes batch requests with a result per entry (SQS, SNS, Kinesis, Typesense).

The call's messages are encoded, checked against the destination's limits and cut into requests
(batch_plan.py: at most one message per group per request, a group's messages in successive requests);
the requests go through a window of `max_in_flight` (window.py: a request only after the previous one
holding any of its groups was acknowledged). Each entry's result is its message's result: an entry the
destination rejects fails alone (parked by the engine, its group held), an entry it could not take for
reasons of its own (throttled, an internal error) is `Unreachable`. A request refused as a whole for a
reason that speaks for the destination (throttling, 5xx, credentials, nothing listening) is an outage:
the window stops, and with nothing acknowledged the call raises `SinkUnavailable`.

The client is asyncio (aiobotocore, httpx) on the sink's own event loop thread (base.EventLoopThread).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
from typing import Any, NamedTuple

from cdc_pipeline.core.findings import Finding
from cdc_pipeline.sinks.base import (
    NOT_SENT,
    EventLoopThread,
    OutboundMessage,
    Sink,
    SinkConfigLike,
    SinkUnavailable,
    Unreachable,
)
from cdc_pipeline.sinks.batch_plan import RequestLimits, plan_requests
from cdc_pipeline.sinks.window import send_window

_PENDING = "\x00pending"  # placeholder result; never returned (compared by identity)


class DestinationDown(Exception):
    """The destination as a whole did not take a request (throttled, 5xx, refused credentials, unreachable).
    Its text is shown to operators: never a secret."""


class Encoded(NamedTuple):
    target: str  # where the entry goes (a queue, topic, stream or collection): one request per target
    entry: Any  # the request entry
    size: int  # its size as the destination counts it against its limits
    barrier: bool = False  # sent alone, after every earlier message of the call and before every later one


class BatchingSink(Sink):
    kind: str  # for messages: "sqs", "kinesis", ...
    request_limits: RequestLimits

    def __init__(self, name: str, max_in_flight: int) -> None:
        self.name = name
        self.max_in_flight = max_in_flight
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
    async def send(self, target: str, entries: Sequence[tuple[OutboundMessage, Any]]) -> list[str | None]:
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
    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        if not batch:
            return []
        if not self._connected:
            self.open()
        assert self._runner is not None
        encoded = [self.encode(m) for m in batch]
        results: list[str | None] = [_PENDING] * len(batch)
        stopped: set[str] = set()  # groups with a message not acknowledged: their later ones are not sent
        down: str | None = None
        for segment, barrier in _segments(encoded):
            if down is None:
                down = self._send_segment(batch, encoded, segment, stopped, results)
            if barrier is not None and down is None:
                if (g := batch[barrier].group) is not None and g in stopped:
                    results[barrier] = NOT_SENT
                else:
                    down = self._runner.run(self._send_all(batch, encoded, [[barrier]], results))
            for i in [*segment, *([barrier] if barrier is not None else [])]:
                if results[i] is _PENDING:
                    results[i] = Unreachable(f"not sent: {down}")
                if results[i] is not None and (g := batch[i].group) is not None:
                    stopped.add(g)
        if down is not None and not any(r is None for r in results):
            raise SinkUnavailable(f"{self.kind} sink {self.name!r}: {down}")
        return results

    def _send_segment(self, batch: Sequence[OutboundMessage], encoded: list[Encoded | str], segment: list[int],
                      stopped: set[str], results: list[str | None]) -> str | None:
        """Plan and send the messages of `segment` (indexes); returns why the destination is down, if it is."""
        groups = [batch[i].group for i in segment]
        sizes: list[int | str] = [NOT_SENT if g is not None and g in stopped  # stopped in an earlier segment
                                  else (e if isinstance(e := encoded[i], str) else e.size)
                                  for i, g in zip(segment, groups, strict=True)]
        plan = plan_requests(groups, sizes, self.request_limits)
        for n, why in plan.refused.items():
            results[segment[n]] = why
        requests = [[segment[n] for n in request] for request in plan.requests]
        assert self._runner is not None
        return self._runner.run(self._send_all(batch, encoded, requests, results)) if requests else None

    async def _send_all(self, batch: Sequence[OutboundMessage], encoded: list[Encoded | str],
                        requests: list[list[int]], results: list[str | None]) -> str | None:
        """Send the requests through the window; returns why the destination is down, if it went down."""
        down: list[str] = []
        slots = asyncio.Semaphore(self.max_in_flight)

        async def to_target(target: str, request: list[int]) -> None:
            try:
                outcome = await self.send(target, [(batch[i], _entry(encoded[i])) for i in request])
            except DestinationDown as exc:
                down.append(str(exc))
                outcome = [Unreachable(f"not delivered: {exc}")] * len(request)
            for i, r in zip(request, outcome, strict=True):
                results[i] = r

        async def send(request: Sequence[int]) -> set[str]:
            by_target: dict[str, list[int]] = {}
            for i in request:
                by_target.setdefault(_entry_target(encoded[i]), []).append(i)
            await asyncio.gather(*(to_target(t, idx) for t, idx in by_target.items()))
            return {g for i in request if results[i] is not None and (g := batch[i].group) is not None}

        def skip(request: Sequence[int]) -> None:
            for i in request:
                results[i] = Unreachable(f"not sent: {down[0]}") if down else NOT_SENT

        await send_window(requests, [m.group for m in batch], slots, send, skip, lambda: bool(down))
        return down[0] if down else None


def _entry(e: Encoded | str) -> Any:
    assert not isinstance(e, str)  # refused messages are in no request
    return e.entry


def _entry_target(e: Encoded | str) -> str:
    assert not isinstance(e, str)
    return e.target


def _segments(encoded: list[Encoded | str]) -> list[tuple[list[int], int | None]]:
    """The call cut at its barriers: (indexes before a barrier, the barrier's index or None at the end)."""
    out: list[tuple[list[int], int | None]] = []
    current: list[int] = []
    for i, e in enumerate(encoded):
        if not isinstance(e, str) and e.barrier:
            out.append((current, i))
            current = []
        else:
            current.append(i)
    out.append((current, None))
    return out
