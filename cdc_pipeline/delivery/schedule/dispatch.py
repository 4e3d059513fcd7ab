"""Hand messages to a sink in the calls its ordering needs, and apply the engine's policy to the results.

The sink reports raw per-message outcomes (for a prefix of the call, the rest not attempted: order.py `answered`);
`GroupOrder` (order.py) decides what each call carries and what is held back. A request sink's calls go through the scheduler's requests (requests.py). Before each call
the sink learns the earliest position the engine will park, so a sink that commits its own position never
records one past a message that is not delivered yet.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.schedule.order import GroupOrder, answered, position_of
from cdc_pipeline.delivery.schedule.requests import Requests, Stopped
from cdc_pipeline.sinks.base import Limits, OutboundMessage, Sink, SinkUnavailable, Unreachable
from cdc_pipeline.sinks.request_sink import RequestSink


class Dispatch:
    def __init__(self, sink: Sink, limits: Limits, stop: threading.Event | None = None) -> None:
        """`limits`: the sink's, resolved (limits.py); `stop` set: a request sink sends nothing more (requests.py)."""
        self.sink = sink
        self.one_per_group = not limits.ordered
        self._deliver = (Requests(sink, limits.batch_size or 1, limits.max_in_flight, stop).deliver
                         if isinstance(sink, RequestSink) else sink.deliver)

    def __call__(self, messages: Sequence[OutboundMessage], kept_back: Position | None = None) -> list[str | None]:
        """One result per message: None (delivered), its own error, or ordering.HELD. `kept_back` is the
        earliest position of the batch the engine parks without sending. Raises SinkUnavailable when the
        destination is down and nothing was delivered."""
        order = GroupOrder([m.group for m in messages], one_per_group=self.one_per_group)
        ceiling, seen = kept_back, 0
        while call := order.next_call():
            for i in order.parked[seen:]:
                pos = position_of(messages[i])
                ceiling = pos if ceiling is None else min(ceiling, pos)
            seen = len(order.parked)
            self.sink.context.ceiling = ceiling
            try:
                results = self._deliver([messages[i] for i in call])
            except Stopped:  # the run stops: the call is not settled (the next run sends it)
                raise
            except SinkUnavailable as exc:
                if not order.delivered:
                    raise
                order.give_up(call, Unreachable(f"not delivered: {exc}"))
                break
            order.record(call, answered(results, len(call), self.sink.name))
        return order.outcome()


def deliver_in_order(sink: Sink, messages: Sequence[OutboundMessage], kept_back: Position | None = None,
                     limits: Limits | None = None) -> list[str | None]:
    """`messages` through a one-off `Dispatch` with `limits` (default: the sink's own), as the engine would
    hand them (benchmarks, tests)."""
    return Dispatch(sink, limits or sink.limits())(messages, kept_back)
