"""A sink's limits as the scheduler keeps them: the one reader of the sink's `batch_size` and `max_in_flight`.

The sink declares its own defaults and whether one call keeps order (`Sink.limits()`); the sink's config
overrides the sizes (`sinks[].batch_size`, `sinks[].max_in_flight`; config/sinks.py folds the deprecated
`destination.` keys into them), and `delivery.batch_size` is the default of a sink that declares none.
"""

from __future__ import annotations

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.sinks.base import Limits, Sink
from cdc_pipeline.sinks.request_sink import RequestSink


def resolve(config: PipelineConfig, sink_config: SinkConfig, sink: Sink | None) -> tuple[Limits, int]:
    """The sink's limits, and the log rows of a call settled on its own: a call is one `deliver` of the sink,
    or, for a request sink, as many rows as its `max_in_flight` requests hold (at most `delivery.batch_size`
    rows; requests.py cuts it), so a slow destination's offset still moves every few requests."""
    declared = sink.limits() if sink is not None else Limits()
    default = config.delivery.batch_size
    size = sink_config.batch_size or declared.batch_size or default
    limits = Limits(size, sink_config.max_in_flight or declared.max_in_flight, declared.ordered)
    if not isinstance(sink, RequestSink):
        return limits, size
    return limits, max(size, min(size * limits.max_in_flight, default))
