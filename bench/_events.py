"""bench/e2e.py --dagster: what the streaming runs write to Dagster's event log over a window (issue 25
item 6), how busy the machine was meanwhile, and how long a blocked sink takes to turn `lag_below_max` red."""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from dagster import AssetKey, DagsterEventType, DagsterInstance, EventRecordsFilter

from bench._lag import OfferedLoad
from cdc_pipeline.defs.health import SINK_LAG_CHECK


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]  # total, idle + iowait


class MachineLoad(threading.Thread):
    """Samples the 1-minute load average every few seconds and the CPUs' busy share over the whole
    window: the machine is shared, and the figures mean little without them."""

    def __init__(self, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.every, self.samples = every, [os.getloadavg()[0]]
        self.halt = threading.Event()
        self.cpu0 = _cpu_times()
        self.busy = 0.0
        self.start()

    def run(self) -> None:
        while not self.halt.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> str:
        self.halt.set()
        self.join()
        total, idle = _cpu_times()
        self.busy = 1 - (idle - self.cpu0[1]) / max(1, total - self.cpu0[0])
        s = self.samples
        return (f"load average (1 min) min {min(s):.2f} / mean {sum(s) / len(s):.2f} / max {max(s):.2f} "
                f"on {os.cpu_count()} CPUs; CPUs {100 * self.busy:.0f}% busy over the window")


@dataclass
class AssetEvents:
    materializations: int = 0
    # check -> (seconds into the window, passed), in order
    checks: dict[str, list[tuple[float, bool]]] = field(default_factory=lambda: defaultdict(list))

    @property
    def evaluations(self) -> int:
        return sum(len(v) for v in self.checks.values())

    def flipped(self) -> bool:
        return any(len({passed for _, passed in v}) > 1 for v in self.checks.values())


def _records(instance: DagsterInstance, kind: DagsterEventType, after: float, before: float) -> list[Any]:
    with warnings.catch_warnings():  # "use fetch_materializations": one call for both kinds is simpler here
        warnings.simplefilter("ignore", UserWarning)
        found = instance.get_event_records(EventRecordsFilter(event_type=kind, after_timestamp=after,
                                                              before_timestamp=before), ascending=True)
    return list(found)


def count_events(instance: DagsterInstance, after: float, before: float) -> dict[str, AssetEvents]:
    """Per asset: materializations and check evaluations stored with a timestamp in (after, before),
    from every run and the sensors' runless ones."""
    out: dict[str, AssetEvents] = defaultdict(AssetEvents)
    for r in _records(instance, DagsterEventType.ASSET_MATERIALIZATION, after, before):
        out[r.asset_key.to_user_string()].materializations += 1
    for r in _records(instance, DagsterEventType.ASSET_CHECK_EVALUATION, after, before):
        data = r.event_log_entry.dagster_event.asset_check_evaluation_data
        out[data.asset_key.to_user_string()].checks[data.check_name].append((r.timestamp - after, bool(data.passed)))
    return dict(sorted(out.items()))


def event_lines(events: dict[str, AssetEvents], window: float) -> list[tuple[str, ...]]:
    rows = []
    for key, ev in events.items():
        per_hour = 3600 / window
        checks = "; ".join(f"{name} " + " ".join(f"{'+' if p else '-'}@{t:.0f}s" for t, p in outcomes)
                           for name, outcomes in sorted(ev.checks.items())) or "-"
        rows.append((key, str(ev.materializations), f"{ev.evaluations} ({checks})",
                     f"{ev.materializations * per_hour:.0f} + {ev.evaluations * per_hour:.0f}"
                     + (" (a check flipped)" if ev.flipped() else "")))
    return rows


def _lag_outcomes(instance: DagsterInstance, key: AssetKey, after: float) -> list[tuple[float, bool]]:
    return [(r.timestamp, bool(d.passed))
            for r in _records(instance, DagsterEventType.ASSET_CHECK_EVALUATION, after, time.time() + 60)
            if (d := r.event_log_entry.dagster_event.asset_check_evaluation_data).asset_key == key
            and d.check_name == SINK_LAG_CHECK]


@dataclass
class Blocked:
    red_after: float | None  # seconds from the block to the first failed lag_below_max, None: never
    green_after: float | None  # seconds from the release to the first passed one after it
    load: OfferedLoad
    events: dict[str, AssetEvents]
    window: float


def block_sink(instance: DagsterInstance, src: str, dst: str, table: str, key: AssetKey, rate: int,
               first_id: int, limit: float, grace: float = 30.0) -> Blocked:
    """Blocks the sink's destination table (ACCESS EXCLUSIVE, as the e2e test does: the sink's writes
    hang) while `rate` changes/s keep arriving, until `lag_below_max` is recorded failed (or `limit` +
    `grace` + 60 s pass); then releases it and waits for the check to pass again."""
    lock = psycopg.connect(dst)
    lock.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    blocked_at = time.time()
    load = OfferedLoad(src, rate, limit + grace + 60, first_id=first_id, ver=1_000_000)
    red_at = None
    while time.time() < blocked_at + limit + grace + 60 and red_at is None:
        time.sleep(1)
        red_at = next((t for t, passed in _lag_outcomes(instance, key, blocked_at) if not passed), None)
    load.halt.set()
    load.join()
    lock.rollback()  # the release
    released_at = time.time()
    lock.close()
    green_at = None
    while time.time() < released_at + 600 and green_at is None:
        time.sleep(1)
        green_at = next((t for t, passed in _lag_outcomes(instance, key, released_at) if passed), None)
    end = time.time()
    return Blocked(None if red_at is None else red_at - blocked_at, None if green_at is None else green_at - released_at,
                   load, count_events(instance, blocked_at, end), end - blocked_at)
