"""What a streaming run records in Dagster's event log (defs/pacing.py, defs/versions.py): materializations
at most once per report_seconds and only when data moved, a sink's at once when it caught up or fell
behind (what it names as its change-log input, which decides the UI's "Unsynced"); check
evaluations when the outcome flips or a figure moves materially."""

from __future__ import annotations

from dagster import AssetCheckEvaluation, AssetCheckSeverity, AssetKey

from cdc_pipeline.defs.health import PARKED_CHECK, SINK_LAG_CHECK
from cdc_pipeline.defs.pacing import CheckGate, LogPace, SinkPace
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


def _run_sink(pace: SinkPace, lags: dict[int, bool], seconds: int = 600) -> list[tuple[int, str]]:
    """A sink read every 5 s whose offset moves at every read; `lags`: from which second it keeps up (True)
    or is behind (False). Returns (second, named version) of each materialization."""
    recorded, keeping = [], True
    for t in range(5, seconds, 5):
        keeping = lags.get(t, keeping)
        got = pace.input_version(float(t), (t, 0), STREAM, keeping)
        if got is not None:
            pace.recorded((t, 0), got, float(t))
            recorded.append((t, got))
    return recorded


STREAM = "stream"


def test_a_sink_that_keeps_up_names_the_logs_version_at_most_once_per_report_seconds() -> None:
    recorded = _run_sink(SinkPace(every=60, at=0.0, named=STREAM), {})
    assert [t for t, _ in recorded] == list(range(60, 600, 60)) and {v for _, v in recorded} == {STREAM}


def test_a_sink_names_its_offset_at_once_when_it_falls_behind_and_the_log_at_once_when_it_caught_up() -> None:
    recorded = _run_sink(SinkPace(every=60, at=0.0, named=STREAM), {100: False, 300: True})
    assert recorded[:2] == [(60, STREAM), (100, position_version((100, 0)).value)]  # at the read it fell behind
    assert (160, position_version((160, 0)).value) in recorded  # behind: paced, naming its offset
    assert (300, STREAM) in recorded and all(v == STREAM for t, v in recorded if t >= 300)


def test_a_new_log_version_or_a_first_run_is_named_at_once() -> None:
    pace = SinkPace(every=60, at=0.0)  # no materialization of the sink yet
    assert pace.input_version(5.0, (5, 0), STREAM, True) == STREAM
    pace.recorded((5, 0), STREAM, 5.0)
    assert pace.input_version(10.0, (10, 0), STREAM, True) is None
    assert pace.input_version(10.0, (10, 0), "INITIAL", True) == "INITIAL"  # the log's version changed
    behind = SinkPace(every=60, at=0.0, named="0/5:0")  # its last run ended behind, and it is still behind
    assert behind.input_version(5.0, (6, 0), STREAM, False) is None
    assert behind.input_version(60.0, (7, 0), STREAM, False) == "0/7:0"
    assert behind.input_version(60.0, (7, 0), STREAM, True) == STREAM  # caught up


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
