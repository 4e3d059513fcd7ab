"""The rate-limit budget's pure core: slot scheduling and what quota headers mean. No I/O.

Requests are spaced evenly (a token bucket of depth one, GCRA): with ``L = share x quota`` requests
allowed per window ``W``, slots are ``(W + guard) / L`` apart, so ``L + 1`` consecutive slots span more
than ``W + guard`` and no window of length ``W`` can ever see more than ``L`` requests, even when a
request leaves up to ``guard`` after its slot. Even spacing (rather than bursts) is also what makes the
max lag predictable: every collection is polled once per round of ``n`` slots.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from cdc_pipeline.config.api_sources import MAX_RETRY_AFTER_SECONDS


@dataclass(frozen=True)
class Quota:
    requests: int  # the API's quota: requests per `seconds`
    seconds: float
    share: float  # the fraction we may use

    @property
    def budget(self) -> int:
        return max(1, int(self.requests * self.share))

    @property
    def guard(self) -> float:
        """Slack per window for the time between a slot and the request reaching the API."""
        return max(0.2, min(0.05 * self.seconds, 1.0))

    def interval(self, factor: float = 1.0) -> float:
        """Seconds between two of our requests (``factor`` < 1 slows down)."""
        return (self.seconds + self.guard) / self.budget / max(factor, 0.01)


@dataclass(frozen=True)
class BudgetState:
    next_slot: float = 0.0  # epoch seconds of the next free slot
    paused_until: float = 0.0
    factor: float = 1.0




def reserve(state: BudgetState, now: float, quota: Quota,
            max_pause: float = MAX_RETRY_AFTER_SECONDS) -> tuple[BudgetState, float]:
    """Take the next slot: returns the new state and the time the request may be sent.

    A pause (or a schedule pushed behind one) further away than ``max_pause`` is held to it: a state
    stored before the cap existed, or by another version, cannot stall the source for years."""
    interval = quota.interval(state.factor)
    paused_until, next_slot = state.paused_until, state.next_slot
    if paused_until > now + max_pause:  # only a pause is capped: slots queued by callers are the budget
        paused_until = now + max_pause
        next_slot = min(next_slot, paused_until + interval)
    start = max(now, next_slot, paused_until)
    return replace(state, next_slot=start + interval, paused_until=paused_until), start


def pause(state: BudgetState, now: float, seconds: float) -> BudgetState:
    """Nobody sends before ``now + seconds`` (a 429 with Retry-After, an exhausted quota)."""
    return replace(state, paused_until=max(state.paused_until, now + max(0.0, seconds)))


@dataclass(frozen=True)
class QuotaHint:
    """What the API's quota headers say: the real quota, and how much of our share is left."""

    quota: Quota | None = None  # the API's own quota (replaces the configured one)
    factor: float = 1.0
    pause_seconds: float = 0.0


_SFORCE_RE = re.compile(r"api-usage=(\d+)/(\d+)")


def hint_from_headers(headers: Mapping[str, str], configured: Quota) -> QuotaHint | None:
    """Read ``Sforce-Limit-Info: api-usage=N/M`` or ``X-HubSpot-RateLimit-*`` headers.

    Salesforce reports usage of a long (24 h) allowance: past 80% of our share we halve the pace,
    past our share we crawl at a tenth, so the allowance is never spent by us. HubSpot reports the
    real per-interval quota (adopted when smaller than the configured one) and what is left of it:
    when others use more than their part we slow down, and when nothing is left everybody waits.
    """
    h = {k.lower(): v for k, v in headers.items()}
    info = h.get("sforce-limit-info")
    if info and (m := _SFORCE_RE.search(info)):
        used, limit = int(m[1]), int(m[2])
        if limit <= 0:
            return None
        fraction = used / limit
        if fraction >= configured.share:
            return QuotaHint(factor=0.1)
        return QuotaHint(factor=0.5 if fraction >= 0.8 * configured.share else 1.0)
    try:
        maximum = int(h["x-hubspot-ratelimit-max"])
        remaining = int(h["x-hubspot-ratelimit-remaining"])
        interval_ms = int(h.get("x-hubspot-ratelimit-interval-milliseconds", "10000"))
    except (KeyError, ValueError):
        return None
    if maximum <= 0 or interval_ms <= 0:
        return None
    quota = Quota(maximum, interval_ms / 1000, configured.share)
    if remaining <= 0:
        return QuotaHint(quota=quota, factor=0.5, pause_seconds=interval_ms / 1000)
    # Paced at our share, we alone never take `remaining` below what the others are left (max - ours):
    # when it is lower, others use more than their part, and we slow down in proportion.
    reserve = maximum - quota.budget
    if remaining < reserve:
        return QuotaHint(quota=quota, factor=min(1.0, max(0.1, remaining / reserve)))
    return QuotaHint(quota=quota)


def retry_after_seconds(value: str | None, now: float, default: float,
                        cap: float = MAX_RETRY_AFTER_SECONDS) -> float:
    """``Retry-After`` as seconds or an HTTP date, at most ``cap`` (an epoch sent where seconds belong,
    or a date decades away, would stall the source for good); ``default`` when absent or unreadable."""
    return min(cap, _retry_after(value, now, default))


def _retry_after(value: str | None, now: float, default: float) -> float:
    if not value:
        return default
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else default
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, OverflowError):
        return default
