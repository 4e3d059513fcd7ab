"""Whether two backfills read disjoint windows of a table (so they may run side by side). Pure.

A window is [start, end) of one sort column; a missing bound is open; a full backfill (no sort column)
covers everything. Bounds are compared as integers, decimals or ISO 8601 times (a time without a zone
is UTC, as partitions are); anything else (text, whose order depends on a collation) counts as
overlapping, so such backfills keep queueing one after the other.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Protocol


class Window(Protocol):
    sort_column: str | None
    start: str | None
    end: str | None


Bound = int | Decimal | datetime


def parse_bound(text: str) -> Bound | None:
    """The bound as a comparable value, or None when it is not a number or a time."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = Decimal(text)
        if number.is_finite():
            return number
    except InvalidOperation:
        pass
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _before(end: str | None, start: str | None) -> bool:
    """end <= start, for bounds that compare; an open bound is never before anything."""
    if end is None or start is None:
        return False
    a, b = parse_bound(end), parse_bound(start)
    if a is None or b is None or isinstance(a, datetime) != isinstance(b, datetime):
        return False
    return a <= b  # type: ignore[operator]


def disjoint(a: Window, b: Window) -> bool:
    if a.sort_column is None or a.sort_column != b.sort_column:
        return False
    return _before(a.end, b.start) or _before(b.end, a.start)
