"""A sink whose destination takes requests on an asyncio client (webhook, SQS, SNS, Kinesis, Typesense).

It sends one request per call (`send`) on its own event loop and says what became of each message; the
scheduler (delivery/schedule/requests.py) cuts what it delivers into calls of the sink's `batch_size`, keeps
up to its `max_in_flight` of them out at once on that loop, and keeps each group's order across them. A
sink of this kind knows nothing of groups.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import NamedTuple

from cdc_pipeline.sinks.base import EventLoopThread, OutboundMessage, Sink, SinkUnavailable


class Sent(NamedTuple):
    """What one request did: a result per message, or per message of a prefix of the request (the rest not
    attempted, as `Sink.deliver`'s; None, an error, `NOT_SENT`, `Unreachable`), and why the
    destination as a whole is down if it is (the scheduler then sends nothing more: its messages not
    acknowledged are `Unreachable`)."""

    results: list[str | None]
    down: str | None = None


class RequestSink(Sink):
    @abc.abstractmethod
    def loop(self) -> EventLoopThread:
        """The sink's event loop, connected (opens the sink when it is not)."""

    @abc.abstractmethod
    async def send(self, batch: Sequence[OutboundMessage]) -> Sent:
        """One request of `batch` (in commit order), on the sink's loop."""

    def alone(self, message: OutboundMessage) -> bool:
        """Whether `message` goes in a request of its own, after every earlier one and before every later one
        (a truncate of a collection)."""
        return False

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        """`batch` as one request (the scheduler sends through `send` itself)."""
        if not batch:
            return []
        results, down = self.loop().run(self.send(batch))
        if down is not None and not any(r is None for r in results):
            raise SinkUnavailable(down)
        return results
