"""Pure checks of the Kafka sink: which topics a data-driven `route` may name, and record headers.

A route is computed from row data (a Spark SQL expression), so whoever can write the source can choose
it: a value that is not a legal topic name, or names an internal topic (`__consumer_offsets`, ...), or
(with `route_prefixes` set) falls outside the allowed prefixes, is that message's failure (parked),
never the run's, like the Postgres sink's routes (sinks/routes.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

MAX_TOPIC_CHARS = 249  # Kafka's limit
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]+$")


def topic_problem(route: str | None, allowed_prefixes: Sequence[str] | None) -> str | None:
    """Why this topic cannot be written (None when it can; a None route means the configured topic)."""
    if route is None:
        return None
    shown = repr(route[:80]).encode("unicode_escape").decode("ascii")
    if not _TOPIC_RE.match(route) or len(route) > MAX_TOPIC_CHARS or route in (".", ".."):
        return f"invalid topic {shown}: 1-{MAX_TOPIC_CHARS} characters of A-Z a-z 0-9 . _ -"
    if route.startswith("__"):
        return f"topic {shown} is internal to Kafka"
    if allowed_prefixes is not None and not any(route.startswith(p) for p in allowed_prefixes):
        return f"topic {shown} is outside the sink's route_prefixes ({', '.join(allowed_prefixes)})"
    return None


def headers(key: str, payload: bytes) -> list[tuple[str, bytes]]:
    """The record's headers: the idempotency key always; `table` (schema.table) and `action` when the
    message has them (a transform may have dropped them)."""
    out = [("idempotency_key", key.encode())]
    try:
        message = json.loads(payload)
    except ValueError:
        return out
    if not isinstance(message, dict):
        return out
    meta = message.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("table_schema"), str) and isinstance(meta.get("table_name"), str):
        out.append(("table", f"{meta['table_schema']}.{meta['table_name']}".encode()))
    if isinstance(message.get("action"), str):
        out.append(("action", message["action"].encode()))
    return out
