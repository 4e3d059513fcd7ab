"""What a streaming run records in Dagster's event log (defs/pacing.py, defs/versions.py): materializations
at most once per report_seconds and only when data moved, aligned with the change log's versions; check
evaluations when the outcome flips or a figure moves materially."""

from __future__ import annotations

from dagster import AssetCheckEvaluation, AssetCheckSeverity, AssetKey

from cdc_pipeline.defs.health import PARKED_CHECK, SINK_LAG_CHECK
from cdc_pipeline.defs.pacing import CheckGate, LogPace, SinkPace, covers
from cdc_pipeline.defs.versions import position_version, provenance_tags, version_position

KEY = AssetKey(["sink", "s"])


def _lag(seconds: float, limit: float = 60.0) -> AssetCheckEvaluation:
    return AssetCheckEvaluation(asset_key=KEY, check_name=SINK_LAG_CHECK, passed=seconds <= limit,
                                severity=AssetCheckSeverity.ERROR,
                                metadata={"lag_seconds": seconds, "lag_messages": 0, "max_lag_seconds": limit})


def _parked(count: int, oldest: float) -> AssetCheckEvaluation:
    return AssetCheckEvaluation(asset_key=KEY, check_name=PARKED_CHECK, passed=oldest <= 3600,
                                severity=AssetCheckSeverity.WARN,
                                metadata={"parked": count, "oldest_parked_seconds": oldest,
                                          "max_parked_age_seconds": 3600})


def test_checks_are_recorded_when_they_change() -> None:
    gate = CheckGate()
    recorded = [s for s in (0.2, 0.9, 0.1, 1.5, 0.4) * 100 if gate.changed([_lag(s)])]
    assert recorded == [0.2], "a steady lag is recorded once, not at every read"
    # A stall: growing lag recorded at quarter-limit steps, the failure at once, then at +50 % steps.
    gate = CheckGate()
    seen = [s for s in range(0, 3600, 5) if gate.changed([_lag(float(s))])]
    assert seen[:5] == [0, 15, 30, 45, 65]  # 65: the first read over the 60 s limit (passed -> failed)
    assert len(seen) <= 15 and all(b >= a * 1.5 for a, b in zip(seen[4:], seen[5:], strict=False))
    assert gate.changed([_lag(0.0)])  # recovered: passes again
    # Parked messages: a new parked message is news; its age only at quarter-limit steps.
    gate = CheckGate()
    assert gate.changed([_parked(0, 0)]) and gate.changed([_parked(1, 5)])
    assert not gate.changed([_parked(1, 600)]) and gate.changed([_parked(1, 910)])
    assert not gate.changed([_parked(1, 1000)]) and gate.changed([_parked(3, 1000)])
    assert gate.changed([_parked(3, 3700)])  # fails: older than max_parked_age_seconds


def test_the_change_log_materializes_when_it_moved_at_most_once_per_report_seconds() -> None:
    pace = LogPace(every=60, at=0.0)
    times = []
    for t in range(0, 3600, 5):  # the head moves at every read
        if pace.due((t, 0), float(t)):
            pace.recorded((t, 0), float(t))
            times.append(t)
    assert len(times) == 59 and all(b - a >= 60 for a, b in zip(times, times[1:], strict=False))
    assert not pace.due((times[-1], 0), 10_000.0), "nothing moved: nothing recorded"


def test_a_caught_up_sink_follows_the_change_logs_versions() -> None:
    pace = SinkPace(every=60, at=0.0)
    log_times = list(range(2, 3600, 62))  # the log records every ~60 s, at its own phase
    recorded: list[tuple[int, str]] = []
    for t in range(0, 3600, 5):
        log_at = max((x for x in log_times if x <= t), default=None)
        log_version = None if log_at is None else f"{log_at}:0"
        offset = (t, 0)  # caught up: the sink holds everything up to now
        got = pace.input_version(float(t), offset, log_version, None if log_at is None else float(log_at),
                                 drained=True)
        if got is not None:
            pace.recorded(offset, got, log_version, float(t))
            recorded.append((t, got))
    assert 50 <= len(recorded) <= 60
    assert all(b[0] - a[0] >= 60 for a, b in zip(recorded, recorded[1:], strict=False))
    # Each names the log's latest version, so the sink reads up to date; and it follows the log closely.
    for t, got in recorded:
        latest = max(x for x in log_times if x <= t)
        assert got == f"{latest}:0" and t - latest <= 10, (t, got)


def test_a_lagging_sink_names_its_own_offset() -> None:
    pace = SinkPace(every=60, at=0.0, caught_up=False)
    assert pace.input_version(30.0, (5, 0), "100:0", 29.0, drained=False) is None  # too soon
    assert pace.input_version(61.0, (5, 0), "100:0", 60.0, drained=False) == "0/5:0"  # its own offset
    pace.recorded((5, 0), "5:0", "100:0", 61.0)
    assert pace.input_version(200.0, (5, 0), "100:0", 190.0, drained=False) is None  # did not move


def test_versions_are_positions_and_tags_carry_provenance() -> None:
    assert position_version((123, 4)).value == "0/7B:4" and version_position("0/7B:4") == (123, 4)
    assert position_version((0x16B374D848, 0)).value == "16/B374D848:0"
    assert version_position("123:4") == (123, 4)  # a version recorded before, in the log's own notation
    assert version_position("a1b2c3") is None and version_position(None) is None
    tags = provenance_tags(position_version((9, 1)), "run-1", {AssetKey(["cdc", "change_log"]): ("9:1", 42),
                                                                 AssetKey(["source", "t"]): ("INITIAL", None)})
    assert tags["dagster/data_version"] == "0/9:1" and tags["dagster/code_version"] == "run-1"
    assert tags["dagster/input_data_version/cdc/change_log"] == "9:1"
    assert tags["dagster/input_event_pointer/cdc/change_log"] == "42"
    assert tags["dagster/input_event_pointer/source/t"] == "NULL"


def test_without_the_change_log_in_dagster_a_sink_records_every_report_seconds() -> None:
    pace = SinkPace(every=60, at=0.0)  # a drain outside Dagster: the log records no versions
    times = []
    for t in range(0, 600, 5):
        got = pace.input_version(float(t), (t, 0), None, None, drained=True)
        if got is not None:
            pace.recorded((t, 0), got, None, float(t))
            times.append((t, got))
    assert times == [(t, position_version((t, 0)).value) for t in range(60, 600, 60)]


def test_a_sink_covers_the_logs_version_at_or_before_its_offset_or_when_drained() -> None:
    assert covers("10:2", (10, 2), drained=False) and covers("10:2", (11, 0), drained=False)
    assert not covers("10:2", (10, 1), drained=False) and covers("10:2", (10, 1), drained=True)
    assert not covers(None, (10, 1), drained=True) and not covers("a1b2", (10, 1), drained=False)
