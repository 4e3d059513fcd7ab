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


# A JSON text's strings and structural characters (numbers, true, false and null fall between the matches).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]')
_WANTED = {("action",): "action", ("metadata", "table_schema"): "schema", ("metadata", "table_name"): "table"}


def headers(key: str, payload: bytes) -> list[tuple[str, bytes]]:
    """The record's headers: the idempotency key always; `table` (schema.table) and `action` when the
    message has them as its own fields (top-level `action`, `metadata.table_schema` and `.table_name`; a
    transform may have dropped them). Read by structure, so a look-alike inside the record, an annotation
    or an enrichment (which come after the envelope) is never taken for them."""
    out = [("idempotency_key", key.encode())]
    found = message_fields(payload.decode())
    if "schema" in found and "table" in found:
        out.append(("table", f"{found['schema']}.{found['table']}".encode()))
    if "action" in found:
        out.append(("action", found["action"].encode()))
    return out


def message_fields(text: str) -> dict[str, str]:
    """The string values of the fields in ``_WANTED`` (by their path from the top object; the last one where a
    key repeats, as a JSON parser keeps). One pass without recursion: any nesting depth is fine."""
    found: dict[str, str] = {}
    path: list[str | None] = []  # the key of each open container (None inside an array)
    objects: list[bool] = []  # whether each open container is an object
    key: str | None = None
    expect_key = False
    for match in _TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first == '"':
            if expect_key:
                # Only keys of the top two levels can matter: decode those alone.
                key = json.loads(token) if len(objects) <= 2 else ""
                expect_key = False
            elif key is not None and len(path) <= 2:
                wanted = _WANTED.get((*path[1:], key))  # type: ignore[arg-type]
                if wanted is not None:
                    found[wanted] = json.loads(token)
        elif first == ",":
            expect_key, key = bool(objects and objects[-1]), None
        elif first in "{[":
            path.append(key if objects and objects[-1] else None)
            objects.append(first == "{")
            expect_key, key = first == "{", None
        elif first in "}]":
            if objects:
                objects.pop()
                path.pop()
            expect_key, key = False, None
    return found
