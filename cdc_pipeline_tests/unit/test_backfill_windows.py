"""Which backfill windows may run side by side: only provably disjoint ones."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from cdc_pipeline.state.windows import disjoint


@dataclass
class W:
    sort_column: str | None
    start: str | None
    end: str | None


def test_partitions_of_one_column() -> None:
    day1, day2 = W("ts", "2026-01-01", "2026-01-02"), W("ts", "2026-01-02", "2026-01-03")
    assert disjoint(day1, day2) and disjoint(day2, day1)
    assert not disjoint(day1, W("ts", "2026-01-01T12:00:00", "2026-01-05"))
    assert disjoint(W("n", "0", "10"), W("n", "10", None))
    assert not disjoint(W("n", "0", "10"), W("n", "9", None))
    assert disjoint(W("ts", "2026-01-01 00:00:00+00:00", "2026-01-02 00:00:00+00:00"),
                    W("ts", "2026-01-02T00:00:00", "2026-01-03T00:00:00"))  # no zone means UTC


def test_what_cannot_be_compared_overlaps() -> None:
    assert not disjoint(W(None, None, None), W("n", "0", "1"))  # a full backfill covers everything
    assert not disjoint(W("a", "0", "1"), W("b", "5", "6"))  # other columns
    assert not disjoint(W("t", "a", "m"), W("t", "m", "z"))  # text order depends on a collation
    assert not disjoint(W("n", "0", "10"), W("n", "2026-01-01", None))  # a number and a time
    assert not disjoint(W("n", None, "10"), W("n", None, "20"))


@given(st.integers(-1000, 1000), st.integers(0, 500), st.integers(-1000, 1000), st.integers(0, 500))
def test_integer_windows_agree_with_their_rows(a: int, la: int, b: int, lb: int) -> None:
    first, second = W("n", str(a), str(a + la)), W("n", str(b), str(b + lb))
    shared = set(range(a, a + la)) & set(range(b, b + lb))
    if disjoint(first, second):  # sound: never two windows that share a row
        assert not shared
    if la and lb and not shared:  # and complete for non-empty integer windows
        assert disjoint(first, second)
