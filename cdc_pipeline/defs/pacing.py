"""How often a streaming run writes to Dagster's event log. The run reads its figures every
`streaming.EVENT_SECONDS` (the lag checks stay that responsive; metrics and `status` show the figures
live), but records only what means something:

- a materialization at most once per `report_seconds`, and only when data moved (the log's head, a
  sink's offset); and a sink's at once when it caught up or fell behind (its lag crossed
  `delivery.max_lag_seconds`), so that the UI's "Unsynced" follows within a read (defs/versions.py).
- a check evaluation when the check's outcome (passed, severity, description) differs from the one last
  recorded, or when one of its figures moved materially: by at least the figure's step (a quarter of the
  check's limit but at least `EVENT_SECONDS`, for ages; one message, for the parked count) and by at least
  half of the value last recorded. A lag growing
  from 0 towards a 60 s limit is recorded at 15 s and 30 s, then when it fails; while it keeps failing, at
  each +50 % (90 s, 135 s, ...), so an outage of hours adds a dozen events, not thousands.

Pure: the callers pass the clock and the figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetCheckEvaluation

from cdc_pipeline.core.positions import Position
from cdc_pipeline.defs.health import PARKED_CHECK, SINK_LAG_CHECK, SLOT_LAG_CHECK
from cdc_pipeline.defs.streaming import EVENT_SECONDS
from cdc_pipeline.defs.versions import position_version

# Per check: its figures (metadata keys) and the step each must move by, as (limit key, fraction of the
# limit; an age's step is at least EVENT_SECONDS, the resolution it is read at) or a fixed step.
CHECK_FIGURES: dict[str, list[tuple[str, tuple[str, float] | float]]] = {
    SLOT_LAG_CHECK: [("slot_lag_seconds", ("max_lag_seconds", 0.25))],
    SINK_LAG_CHECK: [("lag_seconds", ("max_lag_seconds", 0.25))],
    PARKED_CHECK: [("oldest_parked_seconds", ("max_parked_age_seconds", 0.25)), ("parked", 1.0)],
}
RELATIVE_STEP = 0.5


def _number(value: Any) -> float:
    raw = getattr(value, "value", value)  # a MetadataValue or a plain number
    return float(raw) if isinstance(raw, int | float) else 0.0


@dataclass
class CheckGate:
    """Lets a check evaluation through when its outcome or a figure changed materially (see above)."""

    last: dict[str, tuple[tuple[Any, ...], dict[str, float]]] = field(default_factory=dict)

    def changed(self, evaluations: Iterable[AssetCheckEvaluation]) -> list[AssetCheckEvaluation]:
        out = []
        for ev in evaluations:
            outcome = (ev.passed, ev.severity, ev.description)
            figures = {name: _number(ev.metadata.get(name)) for name, _ in CHECK_FIGURES.get(ev.check_name, [])}
            before = self.last.get(ev.check_name)
            if before is None or before[0] != outcome or self._moved(ev, before[1], figures):
                self.last[ev.check_name] = (outcome, figures)
                out.append(ev)
        return out

    @staticmethod
    def _moved(ev: AssetCheckEvaluation, before: dict[str, float], now: dict[str, float]) -> bool:
        for name, step in CHECK_FIGURES.get(ev.check_name, []):
            absolute = step if isinstance(step, float) else max(EVENT_SECONDS,
                                                                  _number(ev.metadata.get(step[0])) * step[1])
            delta = abs(now[name] - before.get(name, 0.0))
            if delta > 0 and delta >= absolute and delta >= RELATIVE_STEP * abs(before.get(name, 0.0)):
                return True
        return False


@dataclass
class LogPace:
    """The change log: a materialization when its head moved, at most once per `every` seconds."""

    every: float
    at: float  # when the last one was recorded (the run's start at first)
    head: Position | None = None

    def due(self, head: Position, now: float) -> bool:
        return head != self.head and now - self.at >= self.every

    def recorded(self, head: Position, now: float) -> None:
        self.head, self.at = head, now


@dataclass
class SinkPace:
    """A sink: a materialization when it caught up or fell behind, or the change log's version changed (at
    once), else when its offset moved, at most once per `every` seconds. What it names as its change-log
    input: the log's version while it keeps up, its own offset while it is behind (see defs/versions.py)."""

    every: float
    at: float
    offset: Position | None = None
    named: str | None = None  # the change-log version the last one named (the sink's record before the run's)

    def input_version(self, now: float, offset: Position, log_version: str, keeps_up: bool) -> str | None:
        """The change-log version to name in a materialization now, or None for no materialization."""
        named = log_version if keeps_up else position_version(offset).value
        if keeps_up != (self.named == log_version):
            return named  # it caught up, fell behind, or the log's version is new to it: the UI follows now
        if offset == self.offset or now - self.at < self.every:
            return None
        return named

    def recorded(self, offset: Position, named: str, now: float) -> None:
        self.offset, self.named, self.at = offset, named, now


@dataclass
class ParkedWarning:
    """When a delivery run warns in its log that messages are parked: at once when the first are, then when
    their number changed, at most once per `every` seconds, and every `remind` seconds while any stay."""

    every: float = 60.0
    remind: float = 900.0
    at: float | None = None  # when the last warning was logged
    count: int = 0  # how many were parked then

    def due(self, parked: int, now: float) -> bool:
        if parked == 0:
            self.count = 0
            return False
        since = None if self.at is None else now - self.at
        if since is None or (parked != self.count and since >= self.every) or since >= self.remind:
            self.at, self.count = now, parked
            return True
        return False
