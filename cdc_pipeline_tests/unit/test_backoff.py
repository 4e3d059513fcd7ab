"""Exponential backoff with jitter for failed-message retries."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.core.backoff import next_delay_ms


def mid() -> float:
    return 0.5  # the middle of the jitter band: no jitter


def low() -> float:
    return 0.0


def high() -> float:
    return math.nextafter(1.0, 0.0)  # the largest value random.random() can return


def test_attempt_one_is_the_initial_delay() -> None:
    assert next_delay_ms(1, 100, 30_000, rand=mid) == 100


def test_doubles_until_the_cap() -> None:
    delays = [next_delay_ms(a, 100, 30_000, rand=mid) for a in range(1, 13)]
    assert delays == [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30_000, 30_000, 30_000]


def test_other_multiplier() -> None:
    assert [next_delay_ms(a, 1000, 10**6, multiplier=1.5, rand=mid) for a in range(1, 5)] == [
        1000,
        1500,
        2250,
        3375,
    ]


def test_jitter_band_edges() -> None:
    assert next_delay_ms(3, 100, 30_000, jitter=0.2, rand=low) == 320
    assert next_delay_ms(3, 100, 30_000, jitter=0.2, rand=high) == 480
    assert next_delay_ms(3, 100, 30_000, jitter=0.0, rand=high) == 400


def test_jitter_never_pushes_above_the_cap() -> None:
    assert next_delay_ms(50, 100, 30_000, rand=high) == 30_000
    assert next_delay_ms(50, 100, 30_000, rand=low) == 24_000


def test_huge_attempts_do_not_overflow() -> None:
    assert next_delay_ms(10**9, 100, 30_000, rand=mid) == 30_000
    assert next_delay_ms(10**18, 1, 5, multiplier=10.0, rand=low) == 4


def test_multiplier_one_is_constant() -> None:
    assert {next_delay_ms(a, 250, 30_000, multiplier=1.0, rand=mid) for a in range(1, 100)} == {250}


def test_initial_above_max_is_capped() -> None:
    assert next_delay_ms(1, 50_000, 30_000, rand=mid) == 30_000


def test_zero_delays() -> None:
    assert next_delay_ms(7, 0, 30_000, rand=high) == 0
    assert next_delay_ms(7, 100, 0, rand=high) == 0


@pytest.mark.parametrize("value", [-3.0, 5.0, math.nan, math.inf, -math.inf])
def test_misbehaving_rand_still_respects_bounds(value: float) -> None:
    delay = next_delay_ms(4, 100, 30_000, rand=lambda: value)
    assert 640 <= delay <= 960


def test_default_rand_jitters_within_the_band() -> None:
    delays = [next_delay_ms(1, 100, 30_000) for _ in range(2000)]
    assert min(delays) >= 80 and max(delays) <= 120
    assert len(set(delays)) > 10  # actually random


def test_mean_matches_the_base_delay() -> None:
    rng = random.Random(1234)
    delays = [next_delay_ms(3, 100, 30_000, rand=rng.random) for _ in range(20_000)]
    assert sum(delays) / len(delays) == pytest.approx(400, rel=0.01)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempt": 0},
        {"attempt": -1},
        {"attempt": True},
        {"attempt": 1.0},
        {"initial_ms": -1},
        {"max_ms": -1},
        {"multiplier": 0.5},
        {"multiplier": math.nan},
        {"multiplier": math.inf},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"jitter": math.nan},
    ],
)
def test_invalid_arguments(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"attempt": 1, "initial_ms": 100, "max_ms": 1000}
    args.update(kwargs)
    with pytest.raises(ValueError):
        next_delay_ms(**args)  # type: ignore[arg-type]


# -- properties ---------------------------------------------------------------------------------

attempts = st.integers(min_value=1, max_value=10**6)
initials = st.integers(min_value=0, max_value=10**7)
maxima = st.integers(min_value=0, max_value=10**7)
multipliers = st.floats(min_value=1.0, max_value=10.0)
jitters = st.floats(min_value=0.0, max_value=1.0)
points = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@settings(max_examples=500, deadline=None)
@given(attempts, initials, maxima, multipliers, jitters, points)
def test_always_within_bounds(
    attempt: int, initial: int, maximum: int, multiplier: float, jitter: float, point: float
) -> None:
    delay = next_delay_ms(attempt, initial, maximum, multiplier, jitter, rand=lambda: point)
    assert isinstance(delay, int)
    assert 0 <= delay <= maximum


@settings(max_examples=300, deadline=None)
@given(initials, maxima, jitters, points)
def test_first_attempt_is_about_initial(initial: int, maximum: int, jitter: float, point: float) -> None:
    delay = next_delay_ms(1, initial, maximum, jitter=jitter, rand=lambda: point)
    base = min(initial, maximum)
    assert abs(delay - base) <= jitter * base + 0.5


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=10**5),
    maxima,
    st.floats(min_value=1.0, max_value=4.0),
    jitters,
    points,
)
def test_monotone_in_attempt_for_a_fixed_draw(
    initial: int, maximum: int, multiplier: float, jitter: float, point: float
) -> None:
    delays = [
        next_delay_ms(a, initial, maximum, multiplier, jitter, rand=lambda: point) for a in range(1, 40)
    ]
    assert delays == sorted(delays)


# The expected value over rand() is approximated by a fine, even grid of draws.
GRID = [(i + 0.5) / 200 for i in range(200)]


def expected(attempt: int, initial: int, maximum: int, multiplier: float, jitter: float) -> float:
    draws = iter(GRID)
    return sum(
        next_delay_ms(attempt, initial, maximum, multiplier, jitter, rand=lambda: next(draws)) for _ in GRID
    ) / len(GRID)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=10, max_value=10**4),
    st.integers(min_value=10, max_value=10**7),
    st.floats(min_value=1.1, max_value=4.0),
    jitters,
)
def test_expected_delay_grows_until_the_cap(
    initial: int, maximum: int, multiplier: float, jitter: float
) -> None:
    means = [expected(a, initial, maximum, multiplier, jitter) for a in range(1, 30)]
    assert all(later >= earlier for earlier, later in itertools.pairwise(means))
    for attempt, (earlier, later) in enumerate(itertools.pairwise(means), start=1):
        base_next = initial * multiplier**attempt
        if base_next * (1 + jitter) <= maximum:  # the whole band of the next attempt is below the cap
            # Delays are whole milliseconds: each mean is off by up to 0.5 ms, and `earlier`'s error
            # is multiplied, so the absolute slack grows with the multiplier.
            assert later == pytest.approx(earlier * multiplier, rel=0.02, abs=0.5 * multiplier + 1.0)
    # Capped: the mean sits in the clipped band just under max.
    assert means[-1] <= maximum
    if initial * multiplier**28 >= maximum:
        assert means[-1] == pytest.approx(maximum * (1 - jitter / 4), rel=0.02, abs=1.0)
