"""PageSizeOptimizer against synthetic timing models: a simulated database answers each page with
an elapsed time from a cost function, and a statement_timeout of max_query_ms cancels slow ones."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.backfill.page_size import PageSizeOptimizer

Cost = Callable[[int], float]


@dataclasses.dataclass
class Step:
    size: int
    elapsed: float
    timed_out: bool


def run(opt: PageSizeOptimizer, cost: Cost, steps: int) -> tuple[PageSizeOptimizer, list[Step]]:
    """Full pages at the optimizer's size; statement_timeout = max_query_ms cancels slow selects."""
    history: list[Step] = []
    for _ in range(steps):
        size = opt.size
        elapsed = cost(size)
        timed_out = elapsed > opt.max_query_ms
        opt = opt.observe_timeout(size) if timed_out else opt.observe(size, elapsed, size)
        history.append(Step(size, elapsed, timed_out))
    return opt, history


def linear(fixed_ms: float, per_row_ms: float) -> Cost:
    return lambda n: fixed_ms + per_row_ms * n


def converged(per_row_ms: float, steps: int = 40) -> PageSizeOptimizer:
    opt, _ = run(PageSizeOptimizer(), linear(0, per_row_ms), steps)
    return opt


# -- construction and the value contract --------------------------------------------------------


def test_defaults() -> None:
    opt = PageSizeOptimizer()
    assert (opt.max_query_ms, opt.initial, opt.minimum, opt.maximum) == (5000, 1000, 1, 50000)
    assert opt.size == 1000
    assert opt.target_ms == 3750
    assert opt.ms_per_row is None
    assert opt.ceiling is None


@pytest.mark.parametrize(
    ("kwargs", "size"),
    [
        ({"initial": 0}, 1),
        ({"initial": 10**7}, 50000),
        ({"minimum": 10, "initial": 5}, 10),
        ({"initial": 77}, 77),
    ],
)
def test_initial_is_clamped_into_bounds(kwargs: dict[str, int], size: int) -> None:
    assert PageSizeOptimizer(**kwargs).size == size


@pytest.mark.parametrize(
    "kwargs",
    [
        {"minimum": 0},
        {"minimum": 10, "maximum": 9},
        {"max_query_ms": 0},
        {"max_query_ms": -5},
        {"max_query_ms": math.nan},
        {"max_query_ms": math.inf},
    ],
)
def test_invalid_configuration(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PageSizeOptimizer(**kwargs)  # type: ignore[arg-type]


def test_is_an_immutable_value() -> None:
    opt = PageSizeOptimizer()
    grown = opt.observe(1000, 10.0, 1000)
    assert grown is not opt
    assert opt.size == 1000 and opt.samples == ()
    assert grown.size == 2000
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.size = 5  # type: ignore[misc]


def test_same_observations_give_equal_optimizers() -> None:
    a, _ = run(PageSizeOptimizer(), linear(20, 0.3), 25)
    b, _ = run(PageSizeOptimizer(), linear(20, 0.3), 25)
    assert a == b


@pytest.mark.parametrize(
    ("page_size", "elapsed", "rows"),
    [(0, 1.0, 0), (-1, 1.0, 0), (10, -1.0, 10), (10, math.nan, 10), (10, math.inf, 10), (10, 1.0, -1)],
)
def test_observe_rejects_nonsense(page_size: int, elapsed: float, rows: int) -> None:
    with pytest.raises(ValueError):
        PageSizeOptimizer().observe(page_size, elapsed, rows)


def test_observe_timeout_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        PageSizeOptimizer().observe_timeout(0)


# -- growth and convergence -------------------------------------------------------------------


def test_doubles_while_fast_and_stops_at_maximum() -> None:
    opt, history = run(PageSizeOptimizer(), linear(0, 0.001), 12)
    assert [s.size for s in history[:7]] == [1000, 2000, 4000, 8000, 16000, 32000, 50000]
    assert opt.size == 50000


def test_ms_per_row_is_the_window_upper_median() -> None:
    opt = PageSizeOptimizer()
    for page, elapsed in [(1000, 100.0), (2000, 600.0), (4000, 800.0)]:  # 0.1, 0.3, 0.2 ms per row
        opt = opt.observe(page, elapsed, page)
    assert opt.ms_per_row == pytest.approx(0.2)
    assert opt.observe(opt.size, 0.0, 0).ms_per_row == pytest.approx(0.2)  # a short page adds nothing


def test_instant_pages_do_not_divide_by_zero() -> None:
    assert PageSizeOptimizer().observe(1000, 0.0, 1000).size == 2000


def test_linear_cost_converges_to_the_target() -> None:
    # 0.1 ms per row: 37,500 rows take the 3,750 ms target.
    opt, history = run(PageSizeOptimizer(), linear(0, 0.1), 30)
    assert 0.99 * 37500 <= opt.size <= 37500
    assert all(s.elapsed <= opt.target_ms for s in history)  # approached from below, never crossed
    sizes = [s.size for s in history]
    assert sizes == sorted(sizes)


def test_constant_overhead_converges_to_the_target() -> None:
    # 1 s per select plus 0.1 ms per row: n* = (3750 - 1000) / 0.1 = 27,500.
    opt, history = run(PageSizeOptimizer(), linear(1000, 0.1), 40)
    assert 0.99 * 27500 <= opt.size <= 27500
    assert all(s.elapsed <= opt.target_ms for s in history)


def test_starting_above_the_optimum_comes_down_with_one_timeout() -> None:
    opt, history = run(PageSizeOptimizer(initial=20000), linear(0, 0.5), 10)
    assert [s.timed_out for s in history].count(True) == 1
    assert opt.size == 7500
    assert all(s.elapsed <= opt.max_query_ms for s in history[1:])


def test_over_target_page_shrinks_proportionally() -> None:
    # 8,000 rows in 4,500 ms: 0.5625 ms per row, and 3,750 ms buys 6,666 rows.
    assert PageSizeOptimizer().observe(8000, 4500, 8000).size == 6666


def test_slow_page_backs_off_at_least_by_half_and_sets_a_ceiling() -> None:
    slightly_slow = PageSizeOptimizer().observe(10000, 5500, 10000)
    assert slightly_slow.size == 5000
    assert slightly_slow.ceiling == 8000
    very_slow = PageSizeOptimizer().observe(10000, 50000, 10000)
    assert very_slow.size == 750  # the model asks for less than half


def test_one_fast_outlier_does_not_cause_a_jump() -> None:
    opt = converged(0.1)
    assert opt.size == 37500
    lucky = opt.observe(37500, 375.0, 37500)  # ten times faster than usual, once
    assert lucky.size == 37500
    assert lucky.observe(37500, 3750.0, 37500).size == 37500


def test_speedup_is_followed_once_sustained() -> None:
    opt, history = run(converged(1.0), linear(0, 0.1), 12)
    assert opt.size == 37500
    assert all(not s.timed_out for s in history)


# -- slowdowns, timeouts and the ceiling ------------------------------------------------------


def test_sudden_slowdown_is_contained_and_recovered_from() -> None:
    fast = converged(0.1)
    slow_opt, during = run(fast, linear(0, 1.0), 20)  # the database becomes ten times slower
    timeouts = [s.timed_out for s in during]
    assert timeouts[:3] == [True, True, True] and not any(timeouts[3:])
    assert slow_opt.size == 3750
    assert all(s.elapsed <= slow_opt.target_ms for s in during[4:])

    recovered, after = run(slow_opt, linear(0, 0.1), 40)  # and fast again
    assert not any(s.timed_out for s in after)
    assert recovered.size == 37500


def test_sudden_slowdown_without_statement_timeout() -> None:
    # The select completes, just far too late: one step is enough to get back under the limit.
    opt = converged(0.1).observe(37500, 37500.0, 37500)
    assert opt.size == 3750
    assert opt.ceiling == 30000


def drift(opt: PageSizeOptimizer, per_row_ms: float, rate: float, steps: int) -> list[Step]:
    """Per-row cost grows by `rate` every page; statement_timeout cancels what exceeds the limit."""
    history: list[Step] = []
    for step in range(1, steps + 1):
        size = opt.size
        elapsed = per_row_ms * rate**step * size
        timed_out = elapsed > opt.max_query_ms
        opt = opt.observe_timeout(size) if timed_out else opt.observe(size, elapsed, size)
        history.append(Step(size, elapsed, timed_out))
    return history


def test_gradual_slowdown_is_tracked_smoothly() -> None:
    # 1 % slower every page: 2.7 times slower after 100 pages.
    history = drift(converged(0.1), 0.1, 1.01, 100)
    assert all(0.7 * 5000 <= s.elapsed <= 0.8 * 5000 for s in history)
    assert history[-1].size < 37500 / 2.5


def test_steep_slowdown_is_tracked_with_few_timeouts() -> None:
    # 3 % slower every page, 80 times slower after 150 pages: the size must follow it down.
    history = drift(converged(0.1), 0.1, 1.03, 150)
    assert sum(s.timed_out for s in history) <= 10
    optimum_now = 37500 / 1.03**150
    assert 0.5 * optimum_now <= history[-1].size <= 1.1 * optimum_now


def test_timeout_storm_reaches_minimum_and_recovers() -> None:
    opt = converged(0.1)
    sizes = []
    for _ in range(20):
        before = opt.size
        opt = opt.observe_timeout(before)
        assert opt.size < before or before == opt.minimum
        sizes.append(opt.size)
    assert sizes[-1] == 1
    assert sizes.index(1) < 19  # reached the minimum before the storm ended, and stayed there
    assert opt.ceiling == 30000  # the first timeout of the run set it; the storm did not push it to 1

    recovered, history = run(opt, linear(0, 0.1), 40)
    assert not any(s.timed_out for s in history)
    assert all(s.elapsed <= recovered.target_ms for s in history)
    assert recovered.size == 37500


def test_ceiling_caps_growth_then_relaxes_away() -> None:
    opt = PageSizeOptimizer().observe_timeout(10000)
    assert opt.ceiling == 8000
    ceilings = []
    for _ in range(60):
        opt = opt.observe(opt.size, 1.0, opt.size)  # absurdly fast: only the ceiling holds it back
        if opt.ceiling is not None:
            assert opt.size <= opt.ceiling
            ceilings.append(opt.ceiling)
    assert ceilings == sorted(ceilings) and ceilings[1] == pytest.approx(ceilings[0] * 1.05)
    assert opt.ceiling is None and opt.size == 50000


def test_ceiling_prevents_oscillation_under_nonlinear_cost() -> None:
    # Quadratic cost (say, a sort spilling to disk) fools a linear model into overshooting.
    opt, history = run(PageSizeOptimizer(), lambda n: 1e-5 * n * n, 80)
    assert sum(s.timed_out for s in history) <= 2
    assert all(not s.timed_out for s in history[20:])
    assert all(s.elapsed <= opt.max_query_ms for s in history[20:])


def test_minimum_wins_over_the_ceiling() -> None:
    opt = PageSizeOptimizer(minimum=100, initial=100)
    for _ in range(5):
        opt = opt.observe_timeout(opt.size)
        assert opt.size == 100
    assert opt.ceiling is not None and opt.ceiling < 100


def test_fixed_size_when_minimum_equals_maximum() -> None:
    opt = PageSizeOptimizer(minimum=500, maximum=500, initial=1)
    for step in range(10):
        opt = opt.observe_timeout(500) if step % 3 == 0 else opt.observe(500, 1.0, 500)
        assert opt.size == 500


# -- short pages (end of the table or window) ---------------------------------------------------


@pytest.mark.parametrize(("elapsed", "rows"), [(1.0, 3), (0.0, 0), (3000.0, 10), (4900.0, 999)])
def test_short_page_within_limit_changes_nothing_but_the_streak(elapsed: float, rows: int) -> None:
    opt = converged(0.1)
    after = opt.observe(opt.size, elapsed, rows)
    assert after.size == opt.size
    assert after.samples == opt.samples and after.ms_per_row == opt.ms_per_row
    assert after.ceiling == opt.ceiling


def test_short_page_after_timeouts_resets_the_streak() -> None:
    opt = PageSizeOptimizer().observe_timeout(1000)
    assert opt.timeout_streak == 1
    assert opt.observe(opt.size, 1.0, 0).timeout_streak == 0


def test_slow_short_page_still_backs_off() -> None:
    opt = PageSizeOptimizer().observe(1000, 6000.0, 10)
    assert opt.size == 500
    assert opt.ceiling == 800


def test_end_of_table_does_not_drive_growth() -> None:
    # A 2,500-row table: a full page of 1,000, then a short one of 1,500 at a LIMIT of 2,000.
    opt = PageSizeOptimizer()
    remaining = 2500
    while remaining:
        size = opt.size
        rows = min(size, remaining)
        remaining -= rows
        before = opt
        opt = opt.observe(size, 100.0 + 0.1 * rows, rows)
    assert opt.size == before.size == 2000  # the 1,500-row tail of the second page changed nothing


# -- overhead-dominated selects (e.g. a partial backfill on an unindexed sort column) -------------


def test_fixed_cost_above_target_does_not_collapse_the_page() -> None:
    # Every select scans the whole table: 4 s however many rows it returns.
    opt, history = run(PageSizeOptimizer(), lambda n: 4000.0, 60)
    assert not any(s.timed_out for s in history)
    assert min(s.size for s in history) >= 700
    assert opt.size == 50000  # the biggest page costs no more than the smallest


def test_fixed_cost_with_a_small_per_row_cost_grows_to_its_budget() -> None:
    opt, history = run(PageSizeOptimizer(), linear(3800, 0.01), 80)
    assert not any(s.timed_out for s in history)
    assert min(s.size for s in history) >= 700
    assert opt.size == 50000 and linear(3800, 0.01)(opt.size) <= 0.9 * opt.max_query_ms


def test_fixed_cost_near_the_limit_holds_the_size() -> None:
    opt, history = run(PageSizeOptimizer(), lambda n: 4600.0, 200)
    assert not any(s.timed_out for s in history)
    assert {s.size for s in history[10:]} == {opt.size}
    assert opt.size >= 600


def test_noisy_fixed_cost_does_not_collapse_or_time_out() -> None:
    rng = random.Random(3)
    _, history = run(PageSizeOptimizer(), lambda n: 4000.0 * rng.uniform(0.9, 1.1), 300)
    assert not any(s.timed_out for s in history)
    assert min(s.size for s in history[50:]) >= 100
    assert sum(s.size for s in history[50:]) / 250 >= 20000


# -- noise ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_noisy_linear_cost_stays_near_the_target(seed: int) -> None:
    rng = random.Random(seed)
    cost = linear(20, 0.5)  # n* = 7,460
    opt, history = run(PageSizeOptimizer(), lambda n: cost(n) * rng.uniform(0.8, 1.2), 300)
    assert sum(s.timed_out for s in history) <= 6  # 2 %: noise of ±20 % against 25 % headroom
    settled = history[30:]
    mean_elapsed = sum(s.elapsed for s in settled) / len(settled)
    assert 0.6 * opt.max_query_ms <= mean_elapsed <= 0.8 * opt.max_query_ms
    assert min(s.size for s in settled) >= 3000


# -- properties ---------------------------------------------------------------------------------

configs = st.builds(
    PageSizeOptimizer,
    max_query_ms=st.integers(min_value=50, max_value=60_000),
    initial=st.integers(min_value=-10, max_value=200_000),
    minimum=st.integers(min_value=1, max_value=1000),
    maximum=st.integers(min_value=1000, max_value=100_000),
)


@st.composite
def event_sequences(draw: st.DrawFn) -> list[tuple[str, float, float, float]]:
    """Arbitrary feedback: page size as a factor of the current size, elapsed as a fraction of
    max_query_ms, rows as a fraction of the page."""
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(["observe", "observe", "observe", "timeout"]),
                st.sampled_from([1.0, 1.0, 1.0, 0.1, 0.5, 3.0]),
                st.floats(min_value=0.0, max_value=3.0),
                st.sampled_from([1.0, 1.0, 1.0, 0.0, 0.3, 0.99]),
            ),
            max_size=60,
        )
    )


def apply(opt: PageSizeOptimizer, event: tuple[str, float, float, float]) -> PageSizeOptimizer:
    kind, size_factor, elapsed_fraction, rows_fraction = event
    page_size = max(1, round(opt.size * size_factor))
    if kind == "timeout":
        return opt.observe_timeout(page_size)
    rows = min(page_size, math.floor(page_size * rows_fraction))
    return opt.observe(page_size, elapsed_fraction * opt.max_query_ms, rows)


@settings(max_examples=300, deadline=None)
@given(configs, event_sequences())
def test_size_always_within_bounds(
    opt: PageSizeOptimizer, events: list[tuple[str, float, float, float]]
) -> None:
    assert opt.minimum <= opt.size <= opt.maximum
    for event in events:
        opt = apply(opt, event)
        assert isinstance(opt.size, int)
        assert opt.minimum <= opt.size <= opt.maximum


@settings(max_examples=300, deadline=None)
@given(configs, event_sequences(), st.sampled_from([1.0, 0.5, 2.0]))
def test_timeout_strictly_decreases_the_size_unless_at_minimum(
    opt: PageSizeOptimizer, events: list[tuple[str, float, float, float]], size_factor: float
) -> None:
    for event in events:
        opt = apply(opt, event)
    after = opt.observe_timeout(max(1, round(opt.size * size_factor)))
    if opt.size == opt.minimum:
        assert after.size == opt.minimum
    else:
        assert after.size < opt.size


@settings(max_examples=200, deadline=None)
@given(
    max_query_ms=st.integers(min_value=100, max_value=30_000),
    initial=st.integers(min_value=1, max_value=50_000),
    fixed_fraction=st.floats(min_value=0.0, max_value=0.95),
    per_row_ms=st.floats(min_value=1e-5, max_value=50.0),
)
def test_linear_cost_converges_within_the_limit(
    max_query_ms: int, initial: int, fixed_fraction: float, per_row_ms: float
) -> None:
    cost = linear(fixed_fraction * max_query_ms, per_row_ms)
    opt, history = run(PageSizeOptimizer(max_query_ms=max_query_ms, initial=initial), cost, 80)
    if cost(opt.minimum) > max_query_ms:  # even one row is too slow: nothing to converge to
        assert opt.size == opt.minimum
        return
    assert cost(opt.size) <= max_query_ms
    assert all(not s.timed_out for s in history[-20:])
    optimum = min(opt.maximum, (opt.target_ms - cost(0)) / per_row_ms)
    if fixed_fraction <= 0.4 and optimum >= 4:
        # The size gets close to the optimum (from one row, with a fixed cost above half the
        # limit, no safe step could tell fixed from per-row cost: a documented limitation).
        assert opt.size >= math.floor(0.9 * optimum)
