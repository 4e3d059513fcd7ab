"""Retry delays for failed messages: exponential backoff with jitter (pure: randomness is injected)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable


def next_delay_ms(
    attempt: int,
    initial_ms: int,
    max_ms: int,
    multiplier: float = 2.0,
    jitter: float = 0.2,
    rand: Callable[[], float] = random.random,
) -> int:
    """The delay before retry number ``attempt`` (1 = the first retry), in whole milliseconds.

    ``base = min(max_ms, initial_ms * multiplier ** (attempt - 1))``, then a uniform jitter of
    ``± jitter * base`` (``rand()`` in [0, 1) picks the point; 0.5 means no jitter), clamped to
    ``[0, max_ms]``. So attempt 1 is ``initial_ms ± jitter``, and the result is never negative and
    never above ``max_ms``. Jitter spreads retries of many failed groups so they do not hit a
    recovering sink in lockstep.

    For a fixed ``rand()`` value the delay is non-decreasing in ``attempt``, hence so is its
    expected value; at the cap the upward half of the jitter is clipped, so the mean there is
    ``max_ms * (1 - jitter / 4)``, still not below any earlier attempt's mean.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be an int >= 1, got {attempt!r}")
    if initial_ms < 0 or max_ms < 0:
        raise ValueError(f"initial_ms and max_ms must be >= 0, got {initial_ms!r}, {max_ms!r}")
    # `not x >= y` also rejects NaN.
    if not multiplier >= 1.0 or math.isinf(multiplier):
        raise ValueError(f"multiplier must be a finite number >= 1, got {multiplier!r}")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter must be within [0, 1], got {jitter!r}")

    try:
        growth = multiplier ** (attempt - 1)
    except OverflowError:  # a retry-forever message reaches attempts where this overflows a float
        growth = math.inf
    # (0 * inf would be NaN; float multiplication past the range gives inf, which min() caps.)
    base = 0.0 if initial_ms == 0 else min(float(max_ms), initial_ms * growth)
    # Clamp a misbehaving rand() rather than let it break the bounds.
    point = min(1.0, max(0.0, rand()))
    delay = base * (1.0 + jitter * (2.0 * point - 1.0))
    return min(max_ms, max(0, math.floor(delay + 0.5)))
