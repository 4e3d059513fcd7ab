"""The drain's commit rule (capture/commit_pace.py), over every input."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdc_pipeline.capture.commit_pace import PACE_FACTOR, PACE_FLOOR_MS, CommitPace

rows = st.integers(min_value=1, max_value=100_000)
ms = st.floats(min_value=0, max_value=10_000, allow_nan=False)
batch_ms = st.integers(min_value=1, max_value=10_000)


@given(rows, batch_ms, ms, st.integers(min_value=0, max_value=200_000), ms)
def test_urgent_and_full_batches_commit_at_once(batch_rows, limit, last, changes, waited):
    pace = CommitPace(batch_rows, limit, last)
    assert pace.due(changes, waited, urgent=True)
    assert pace.due(max(changes, batch_rows), waited, urgent=False)


@given(rows, batch_ms, ms, ms)
def test_a_held_transaction_waits_a_few_commit_durations_never_past_batch_ms(batch_rows, limit, last, waited):
    pace = CommitPace(batch_rows, limit, last)
    wait = pace.wait_ms()
    assert wait <= limit
    assert wait == min(limit, max(PACE_FLOOR_MS, PACE_FACTOR * last))
    assert pace.due(0, waited, urgent=False) == (waited >= wait)


@given(batch_ms, st.lists(ms, min_size=1, max_size=5))
def test_the_wait_follows_the_last_commit(limit, durations):
    pace = CommitPace(20_000, limit)
    for took in durations:
        pace.committed(took)
    assert pace.wait_ms() == min(limit, max(PACE_FLOOR_MS, PACE_FACTOR * durations[-1]))


def test_cheap_commits_keep_changes_waiting_milliseconds_not_batch_ms():
    pace = CommitPace(20_000, 200)
    pace.committed(2.0)  # a 2 ms commit
    assert not pace.due(10, 14.9, urgent=False) and pace.due(10, 15.0, urgent=False)
    pace.committed(100.0)  # a slow one: gather up to batch_ms
    assert not pace.due(10, 199.0, urgent=False) and pace.due(10, 200.0, urgent=False)
