"""How a call's messages are cut into a destination's batch requests (SQS/SNS batches of 10, Kinesis
PutRecords of 500, Typesense imports): a pure plan, no I/O.

* A message larger than the destination takes is refused before anything is sent: that message's own
  failure (parked with a clear error; the scheduler holds its group's later messages behind it).
* Requests stay within the destination's count and byte limits, in the call's order. A call holds at most
  one message per group (the scheduler's, delivery/schedule/: these sinks' calls are not `ordered`; none of
  these services promises what becomes of a group's later entry when an earlier one of the same request
  fails), so where each message goes is free.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_entries: int  # entries per request
    max_request_bytes: int  # sum of the entries' sizes per request
    max_entry_bytes: int  # one entry
    what: str  # for errors: "SQS message", "Kinesis record"


@dataclass(slots=True)
class Plan:
    requests: list[list[int]] = field(default_factory=list)  # message indexes, in call order per request
    refused: dict[int, str] = field(default_factory=dict)  # index -> why it was not sent


def plan_requests(sizes: Sequence[int | str], limits: RequestLimits) -> Plan:
    """Cut messages (their encoded sizes, in call order) into requests (see the module doc). A size that is a
    string is that message's own error, found while encoding it (a refused route)."""
    plan = Plan()
    used: list[int] = []  # bytes of each request
    cursor = 0  # requests before it are full
    for i, size in enumerate(sizes):
        if isinstance(size, str) or size > limits.max_entry_bytes:
            plan.refused[i] = size if isinstance(size, str) else too_large(size, limits)
            continue
        at = cursor
        while at < len(plan.requests) and not _fits(plan.requests[at], used[at], size, limits):
            at += 1
        if at == len(plan.requests):
            plan.requests.append([])
            used.append(0)
        plan.requests[at].append(i)
        used[at] += size
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
