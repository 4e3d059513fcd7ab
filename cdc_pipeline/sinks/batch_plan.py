"""How a call's messages are cut into a destination's batch requests (SQS/SNS batches of 10, Kinesis
PutRecords of 500, Typesense imports): a pure plan, no I/O.

* A message larger than the destination takes is refused before anything is sent: that message's own
  failure (parked with a clear error), and its group's later messages of the call are not sent.
* A request holds at most one message per group, and a group's messages go in successive requests: the
  window (sinks/window.py) sends a request only after the previous one holding any of its groups was
  acknowledged. None of these services promises what becomes of a group's later entry when an earlier
  one of the same request fails (Kinesis keeps order only within a call's successful prefix), so a
  group's next message never travels beside its previous one.
* Requests stay within the destination's count and byte limits; ungrouped messages go wherever there is
  room.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from cdc_pipeline.sinks.base import NOT_SENT


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_entries: int  # entries per request
    max_request_bytes: int  # sum of the entries' sizes per request
    max_entry_bytes: int  # one entry
    what: str  # for errors: "SQS message", "Kinesis record"


@dataclass(slots=True)
class Plan:
    requests: list[list[int]] = field(default_factory=list)  # message indexes, in batch order per request
    refused: dict[int, str] = field(default_factory=dict)  # index -> why it was not sent (error or NOT_SENT)


def plan_requests(groups: Sequence[str | None], sizes: Sequence[int | str], limits: RequestLimits) -> Plan:
    """Cut messages (their groups and encoded sizes, in batch order) into requests (see the module doc).
    A size that is a string is that message's own error, found while encoding it (a refused route)."""
    plan = Plan()
    used: list[int] = []  # bytes of each request
    after: dict[str, int] = {}  # a group's next message goes in a request after this index
    stopped: set[str] = set()
    cursor = 0  # requests before it are full
    for i, (group, size) in enumerate(zip(groups, sizes, strict=True)):
        if group is not None and group in stopped:
            plan.refused[i] = NOT_SENT
            continue
        if isinstance(size, str) or size > limits.max_entry_bytes:
            plan.refused[i] = size if isinstance(size, str) else too_large(size, limits)
            if group is not None:
                stopped.add(group)
            continue
        at = max(cursor, after.get(group, -1) + 1) if group is not None else cursor
        while at < len(plan.requests) and not _fits(plan.requests[at], used[at], size, limits):
            at += 1
        if at == len(plan.requests):
            plan.requests.append([])
            used.append(0)
        plan.requests[at].append(i)
        used[at] += size
        if group is not None:
            after[group] = at
        while cursor < len(plan.requests) and len(plan.requests[cursor]) >= limits.max_entries:
            cursor += 1
    return plan


def _fits(request: list[int], used: int, size: int, limits: RequestLimits) -> bool:
    return len(request) < limits.max_entries and used + size <= limits.max_request_bytes


def too_large(size: int, limits: RequestLimits) -> str:
    return (f"message too large: the {limits.what} would be {size} bytes, over the limit of "
            f"{limits.max_entry_bytes} bytes; not sent")


def bounded_id(value: str, max_chars: int, allowed: frozenset[str] | None = None) -> str:
    """`value` where a destination takes it as an id (a group id, a partition key), else a stable digest
    of it (64 hex characters), so one group always maps to one id."""
    if 0 < len(value) <= max_chars and (allowed is None or all(c in allowed for c in value)):
        return value
    return hashlib.sha256(value.encode()).hexdigest()[:max_chars]
