"""A staged micro-batch cut into the calls its sink gets: at most the sink's `batch_size` log rows each.

The log is read in blocks of at least `MIN_LOAD` rows (one query, one stage), whatever a sink's own
`batch_size`: a sink that wants small calls (one message per webhook request, short transactions) does not
pay a query and a stage per call. Each call is settled on its own: its last log position becomes the
sink's offset once everything in it is delivered, filtered out or parked. Pure: values in, calls out.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.schedule.order import position_of
from cdc_pipeline.delivery.staging import StageFailure
from cdc_pipeline.sinks.base import OutboundMessage

MIN_LOAD = 1000  # log rows read and staged at once, at least


@dataclass
class Call:
    """What the sink is handed together and the offset settles together."""

    last: Position  # its last log position: the offset once it is settled
    last_ts: datetime | None  # that position's commit time (lag)
    read: int  # log rows it covers
    filtered: int  # of those, how many no message of this lane stands for
    messages: list[OutboundMessage]
    stage_failed: list[StageFailure]


def cut(positions: Sequence[Position], stamp: Callable[[int], datetime | None], messages: Sequence[OutboundMessage],
        stage_failed: Sequence[StageFailure], size: int) -> list[Call]:
    """Calls of at most `size` log rows each, in log order. `positions` are the batch's rows, `stamp(i)` the
    commit time of row i; `messages` and `stage_failed` what the stage made of them (each lands in the call
    its position is in)."""
    n = len(positions)
    if n == 0:
        return []
    if n <= size:  # the usual case: one call
        return [Call(positions[-1], stamp(n - 1), n, n - len(messages) - len(stage_failed), list(messages),
                     list(stage_failed))]
    ends = list(range(size, n, size)) + [n]  # each call's end row (exclusive)
    lasts = [positions[e - 1] for e in ends]
    msgs: list[list[OutboundMessage]] = [[] for _ in ends]
    failed: list[list[StageFailure]] = [[] for _ in ends]
    for m in messages:
        msgs[_index(lasts, position_of(m))].append(m)
    for f in stage_failed:
        failed[_index(lasts, f[0])].append(f)
    calls: list[Call] = []
    start = 0
    for i, end in enumerate(ends):
        read = end - start
        calls.append(Call(lasts[i], stamp(end - 1), read, read - len(msgs[i]) - len(failed[i]), msgs[i], failed[i]))
        start = end
    return calls


def _index(lasts: Sequence[Position], position: Position) -> int:
    i = bisect_left(lasts, position)
    if i == len(lasts):
        raise ValueError(f"position {position[0]}:{position[1]} is past the batch (last {lasts[-1][0]}:{lasts[-1][1]})")
    return i

