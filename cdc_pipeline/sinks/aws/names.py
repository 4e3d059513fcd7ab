"""Pure checks of the AWS destinations: which names a data-driven `route` may give, and the ids SQS and SNS
take for a group and a deduplication.

A route is computed from row data, so whoever can write the source can choose it: a value that is not a
legal name or (with `route_prefixes` set) falls outside the allowed prefixes is that message's failure
(parked), never the run's, like the Kafka sink's topics (sinks/kafka/topics.py).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from cdc_pipeline.sinks.batch_plan import bounded_id

# SQS and SNS FIFO group and deduplication ids: 1-128 of letters, digits and punctuation.
FIFO_ID_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)
FIFO_ID_MAX = 128
KINESIS_KEY_MAX = 256  # a partition key's Unicode characters

NAME_RULES: dict[str, tuple[re.Pattern[str], str]] = {
    "queue": (re.compile(r"^[A-Za-z0-9_-]{1,80}(\.fifo)?$"), "1-80 characters of A-Z a-z 0-9 _ - (and .fifo)"),
    "topic": (re.compile(r"^[A-Za-z0-9_-]{1,256}(\.fifo)?$"), "1-256 characters of A-Z a-z 0-9 _ - (and .fifo)"),
    "stream": (re.compile(r"^[A-Za-z0-9_.-]{1,128}$"), "1-128 characters of A-Z a-z 0-9 _ . -"),
}


def route_problem(kind: str, route: str | None, allowed_prefixes: Sequence[str] | None) -> str | None:
    """Why `route` cannot name a `kind` ("queue", "topic", "stream"); None when it can or is None."""
    if route is None:
        return None
    shown = repr(route[:80]).encode("unicode_escape").decode("ascii")
    pattern, rule = NAME_RULES[kind]
    if not pattern.match(route):
        return f"invalid {kind} name {shown}: {rule}"
    if allowed_prefixes is not None and not any(route.startswith(p) for p in allowed_prefixes):
        return f"{kind} {shown} is outside the sink's route_prefixes ({', '.join(allowed_prefixes)})"
    return None


def fifo_group_id(group: str | None, key: str) -> str:
    """The FIFO MessageGroupId: the message's group, or (ungrouped: it orders nothing) its own key."""
    return bounded_id(group if group is not None else key, FIFO_ID_MAX, FIFO_ID_CHARS)


def dedup_id(key: str) -> str:
    return bounded_id(key, FIFO_ID_MAX, FIFO_ID_CHARS)


def partition_key(group: str | None, key: str) -> str:
    """The Kinesis partition key: the message's group (so a group stays on one shard), or its own key."""
    return bounded_id(group if group is not None else key, KINESIS_KEY_MAX)
