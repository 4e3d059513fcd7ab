"""Page-size tuning for backfill selects (pure: no I/O, no clock).

The backfill engine asks ``optimizer.size`` for the LIMIT of the next keyset page, runs the select,
then feeds back what happened with :meth:`PageSizeOptimizer.observe` (the select finished) or
:meth:`PageSizeOptimizer.observe_timeout` (it hit ``statement_timeout``). Both return a new optimizer;
an optimizer is an immutable value, so a checkpoint can keep one and tests can replay sequences.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

# Aim each select at this fraction of max_query_ms: the headroom absorbs noise and growing tables.
TARGET_FRACTION = 0.75
# Never grow by more than this factor per page, however fast a page was (one lucky cached page
# must not make the next one huge).
GROWTH_FACTOR = 2.0
# After a timeout or an over-budget page, the next size is at most this fraction of the bad one.
BACKOFF_FACTOR = 0.5
# A timed-out (or over-budget) size S caps later sizes at S * CEILING_FRACTION ...
CEILING_FRACTION = 0.8
# ... and the cap relaxes by this factor per successful full page, so it is forgotten slowly.
CEILING_RELAX = 1.05
# How many recent observations the ms-per-row estimate looks at.
WINDOW = 5
# Completed pages this far apart in size are enough to tell fixed cost from per-row cost ...
FIT_SPREAD = 1.25
# ... looking this far back (proportional shrinks of a page just over the target are small steps,
# so the spread takes a while to build up).
FIT_WINDOW = 16
# A cost line applies while it predicts the latest elapsed time within this fraction (wide enough
# for ordinary noise).
LINE_TOLERANCE = 0.2
# When the fixed cost alone exceeds the target, aim at this fraction of max_query_ms instead.
OVERHEAD_BUDGET_FRACTION = 0.9
# Below this size, a page that cannot grow by the model's rounding grows by one row when safe.
SMALL_PAGE = 16

# (rows, elapsed_ms, completed): completed=False marks a timeout, whose elapsed is a lower bound.
Sample = tuple[int, float, bool]
# (fixed ms per select, ms per row)
CostLine = tuple[float, float]


@dataclass(frozen=True, slots=True)
class PageSizeOptimizer:
    """Chooses keyset page sizes that maximise rows per second while keeping each select under
    ``max_query_ms``.

    Algorithm. Every completed full page (``rows >= page_size``) gives a cost estimate,
    ``elapsed_ms / rows`` milliseconds per row, of which the last :data:`WINDOW` count (a timeout
    adds the lower bound ``max_query_ms / page_size``). The model's proposal is the size that would
    take ``target = TARGET_FRACTION * max_query_ms`` at ``max(latest, upper median of the window)``
    ms per row: the latest estimate lets a slowdown act at once, the median stops one fast outlier
    from causing a big jump. Because the estimate includes the fixed per-select overhead, the
    proposal under ``cost(n) = c + b*n`` is ``target*n / (c + b*n)``, which approaches the exact
    ``n* = (target - c) / b`` from either side without crossing it. Then, by the page's elapsed time:

    * ``elapsed <= target``: grow toward the proposal, never shrink, at most x``GROWTH_FACTOR``
      (so well-under-target pages double, pages near the target grow a little); a page smaller
      than ``SMALL_PAGE`` that rounding would keep in place grows by one row if even an average
      row more would fit in ``max_query_ms``;
    * ``target < elapsed <= max_query_ms``: shrink to the proposal (proportionally to the overshoot),
      unless the time is shown not to be about size (below);
    * ``elapsed > max_query_ms`` (slow) or a timeout: at most ``BACKOFF_FACTOR`` of the page
      (halve or more; for a timeout, of the smaller of that page and the current size, so the
      size strictly decreases unless already at ``minimum``).

    Fixed cost. A least-squares line through the completed pages of the last ``FIT_WINDOW``
    (none from before a timeout or slow page: those usually mean the database changed speed),
    once their sizes span ``FIT_SPREAD``, separates the fixed cost ``c`` from the per-row cost
    (a negative slope counts as flat). It is only believed while it predicts the latest page
    within ``LINE_TOLERANCE``: under a drift, the optimizer moves the size to keep the time level,
    which alone would look like a fixed cost, and the latest page is the check on that. A line is
    remembered, timeouts included, while pages keep matching it, since the spread that revealed
    it ages out of the window. If ``c >= target`` (say, an unindexed sort column, where every
    select scans the table), shrinking cannot reach the target and would only wreck throughput, so
    an over-target page goes to the size the line fits into ``OVERHEAD_BUDGET_FRACTION *
    max_query_ms``, but never more than that budget allows if the line were wrong and all of the
    page's time were per-row cost, and keeps its size if nothing fits. Limitation: at one row, with
    a fixed cost above half of ``max_query_ms``, no safe step tells the two costs apart and the size
    stays put; start from a realistic ``initial``.

    Ceiling. A timeout or slow page of size ``S`` sets a ceiling ``S * CEILING_FRACTION`` (only the
    first timeout of a consecutive run counts: a storm of timeouts while halving says the database
    stalled, not that two rows are too many). Each later successful full page relaxes the ceiling
    by ``CEILING_RELAX``; once it passes ``maximum`` it is dropped. That keeps the optimizer from
    climbing straight back into a wall the model cannot see (non-linear costs, noise), while
    still probing upward over time.

    A short page (``rows < page_size``, the end of the table or window) says nothing about what a
    full page costs (its ratio is overhead-dominated, its page_size is not what was read), so it
    neither feeds the model nor moves the size, unless it was slower than ``max_query_ms`` on its
    own, which backs off like any slow page. Sizes always stay within ``[minimum, maximum]``; the
    minimum wins over the ceiling.
    """

    max_query_ms: int = 5000
    initial: int = 1000
    minimum: int = 1
    maximum: int = 50000
    # State, not constructor arguments: a new optimizer starts at `initial` with no history.
    size: int = field(init=False)
    ceiling: float | None = field(init=False, default=None)
    samples: tuple[Sample, ...] = field(init=False, default=())
    cost_line: CostLine | None = field(init=False, default=None)
    timeout_streak: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.max_query_ms > 0 or math.isinf(self.max_query_ms):
            raise ValueError(f"max_query_ms must be a positive number, got {self.max_query_ms!r}")
        if self.minimum < 1:
            raise ValueError(f"minimum must be >= 1, got {self.minimum}")
        if self.maximum < self.minimum:
            raise ValueError(f"maximum ({self.maximum}) must be >= minimum ({self.minimum})")
        # A misconfigured initial size is clamped rather than rejected: the bounds are the contract.
        object.__setattr__(self, "size", min(self.maximum, max(self.minimum, int(self.initial))))

    @property
    def target_ms(self) -> float:
        """The elapsed time each select aims at."""
        return TARGET_FRACTION * self.max_query_ms

    @property
    def ms_per_row(self) -> float | None:
        """The current cost estimate (upper median of the window), None before any full page."""
        return _upper_median(_ratios(self.samples)) if self.samples else None

    def observe(self, page_size: int, elapsed_ms: float, rows: int) -> PageSizeOptimizer:
        """The select with LIMIT ``page_size`` returned ``rows`` rows after ``elapsed_ms``."""
        _check_page_size(page_size)
        if not elapsed_ms >= 0 or math.isinf(elapsed_ms):
            raise ValueError(f"elapsed_ms must be a finite number >= 0, got {elapsed_ms!r}")
        if rows < 0:
            raise ValueError(f"rows must be >= 0, got {rows}")
        slow = elapsed_ms > self.max_query_ms
        if rows < page_size:
            if not slow:
                return self._evolve(timeout_streak=0)
            ceiling = self._lowered_ceiling(page_size)
            return self._evolve(
                size=self._clamp(page_size * BACKOFF_FACTOR, ceiling), ceiling=ceiling, timeout_streak=0
            )

        ratio = elapsed_ms / rows
        samples = (*self.samples, (rows, float(elapsed_ms), True))[-FIT_WINDOW:]
        proposal = _rows_for(self.target_ms, max(ratio, _upper_median(_ratios(samples))))
        line = _fit(samples, self.max_query_ms) or _still_fits(self.cost_line, rows, elapsed_ms)
        if slow:
            ceiling = self._lowered_ceiling(page_size)
            return self._evolve(
                size=self._clamp(min(proposal, page_size * BACKOFF_FACTOR), ceiling),
                ceiling=ceiling,
                samples=samples,
                cost_line=line,
                timeout_streak=0,
            )

        if elapsed_ms <= self.target_ms:
            new = min(max(proposal, page_size), page_size * GROWTH_FACTOR)
            if (
                math.floor(new) <= page_size < SMALL_PAGE
                and elapsed_ms * (page_size + 1) / page_size <= self.max_query_ms
            ):
                # Stalled by rounding: one more row costs at most an average row (fixed cost >= 0),
                # which still fits in max_query_ms, and the second size reveals the cost line.
                new = page_size + 1
        elif line is not None and line[0] >= self.target_ms:
            fixed_ms, per_row_ms = line
            room_ms = OVERHEAD_BUDGET_FRACTION * self.max_query_ms - fixed_ms
            if room_ms <= 0:
                new = page_size
            else:
                new = min(_rows_for(room_ms, per_row_ms), self._worst_case(page_size, elapsed_ms))
                # The line may allow growth; it never shrinks harder than the plain model would.
                new = max(new, min(_rows_for(self.target_ms, ratio), page_size))
        else:
            new = min(proposal, page_size)
        ceiling = self._relaxed_ceiling()
        return self._evolve(
            size=self._clamp(new, ceiling), ceiling=ceiling, samples=samples, cost_line=line, timeout_streak=0
        )

    def observe_timeout(self, page_size: int) -> PageSizeOptimizer:
        """The select with LIMIT ``page_size`` was cancelled by statement_timeout (max_query_ms)."""
        _check_page_size(page_size)
        # All we know is that it would have taken at least max_query_ms.
        samples = (*self.samples, (page_size, float(self.max_query_ms), False))[-FIT_WINDOW:]
        ceiling = self.ceiling if self.timeout_streak else self._lowered_ceiling(page_size)
        # floor() in _clamp makes BACKOFF_FACTOR * reference < reference for any reference >= 1.
        reference = min(page_size, self.size)
        proposal = _rows_for(self.target_ms, _upper_median(_ratios(samples)))
        return self._evolve(
            size=self._clamp(min(reference * BACKOFF_FACTOR, proposal), ceiling),
            ceiling=ceiling,
            samples=samples,
            timeout_streak=self.timeout_streak + 1,
        )

    # -- helpers -----------------------------------------------------------------------------------

    def _worst_case(self, page_size: int, elapsed_ms: float) -> float:
        """The size that fits OVERHEAD_BUDGET_FRACTION of max_query_ms even if the cost line is
        wrong and all of this page's time was per-row cost: trusting the line, never blindly."""
        return min(
            page_size * GROWTH_FACTOR,
            _rows_for(OVERHEAD_BUDGET_FRACTION * self.max_query_ms, elapsed_ms / page_size),
        )

    def _clamp(self, proposed: float, ceiling: float | None) -> int:
        upper = float(self.maximum) if ceiling is None else min(float(self.maximum), ceiling)
        return max(self.minimum, math.floor(min(proposed, upper)))

    def _lowered_ceiling(self, page_size: int) -> float:
        bad = page_size * CEILING_FRACTION
        return bad if self.ceiling is None else min(self.ceiling, bad)

    def _relaxed_ceiling(self) -> float | None:
        if self.ceiling is None:
            return None
        relaxed = self.ceiling * CEILING_RELAX
        return None if relaxed >= self.maximum else relaxed

    def _evolve(self, **changes: object) -> PageSizeOptimizer:
        # dataclasses.replace() would re-run __init__ and reset the init=False state fields.
        new = copy.copy(self)
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new


def _check_page_size(page_size: int) -> None:
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")


def _ratios(samples: tuple[Sample, ...]) -> list[float]:
    return [elapsed / rows for rows, elapsed, _ in samples[-WINDOW:]]


def _fit(samples: tuple[Sample, ...], max_query_ms: float) -> CostLine | None:
    """The least-squares cost line over the completed pages since the last timeout or slow page,
    if they span ``FIT_SPREAD`` in size and the line predicts the latest page; else None."""
    # A timeout or slow page usually means the database changed speed: pages from before it were
    # measured in another regime.
    since: list[tuple[int, float]] = []
    for rows, elapsed, done in reversed(samples):
        if not done or elapsed > max_query_ms:
            break
        since.append((rows, elapsed))
    if len(since) < 3:
        return None
    sizes = [rows for rows, _ in since]
    if max(sizes) < FIT_SPREAD * min(sizes):
        return None
    mean_rows = sum(sizes) / len(since)
    mean_elapsed = sum(elapsed for _, elapsed in since) / len(since)
    spread = sum((rows - mean_rows) ** 2 for rows in sizes)
    slope = sum((rows - mean_rows) * (elapsed - mean_elapsed) for rows, elapsed in since) / spread
    # A row never costs less than nothing; a negative slope is noise around a flat line.
    per_row = max(0.0, slope)
    line = (mean_elapsed - per_row * mean_rows, per_row)
    # Under drift the optimizer moves the size to keep the time level, which looks like a fixed
    # cost; the latest page (say, one that grew and got slower) is the check on that.
    return _still_fits(line, *since[0])


def _still_fits(line: CostLine | None, rows: int, elapsed_ms: float) -> CostLine | None:
    """The remembered line re-anchored at this page, if it still predicts it."""
    if line is None:
        return None
    fixed_ms, per_row_ms = line
    if abs(fixed_ms + per_row_ms * rows - elapsed_ms) > LINE_TOLERANCE * elapsed_ms:
        return None
    return elapsed_ms - per_row_ms * rows, per_row_ms


def _upper_median(values: list[float]) -> float:
    # The upper of the two middle values: on an even window, err toward the slower estimate.
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _rows_for(budget_ms: float, ms_per_row: float) -> float:
    return math.inf if ms_per_row <= 0 else budget_ms / ms_per_row
