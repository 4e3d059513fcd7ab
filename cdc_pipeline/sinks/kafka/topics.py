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
from json.decoder import scanstring  # type: ignore[attr-defined]

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


_ACTION = ',"action":"'
_META = '","metadata":{"table_schema":"'
_TABLE = ',"table_name":"'


def headers(key: str, payload: bytes) -> list[tuple[str, bytes]]:
    """The record's headers: the idempotency key always; `table` (schema.table) and `action` when the
    message has them (a transform may have dropped them)."""
    out = [("idempotency_key", key.encode())]
    text = payload.decode()
    found = _envelope(text, key)
    if found is None:  # a transform's own shape: parse it
        try:
            message = json.loads(text)
        except ValueError:
            return out
        meta = message.get("metadata") if isinstance(message, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("table_schema"), str) and isinstance(meta.get("table_name"), str):
            out.append(("table", f"{meta['table_schema']}.{meta['table_name']}".encode()))
        if isinstance(message, dict) and isinstance(message.get("action"), str):
            out.append(("action", message["action"].encode()))
        return out
    return [*out, ("table", found[0].encode()), ("action", found[1].encode())]


def _envelope(text: str, key: str) -> tuple[str, str] | None:
    """(schema.table, action) of a message in the stages' shape, read from its envelope without parsing the
    record: {"record":R,"changes":C,"action":"A","metadata":{"table_schema":S,"table_name":T,...}}. The
    envelope is the last such sequence whose metadata names this message's idempotency key (an annotation
    after it cannot hold that key: it is written before the commit that gives the key)."""
    end = len(text)
    while (at := text.rfind(_ACTION, 0, end)) >= 0:
        end = at
        start = at + len(_ACTION)
        stop = text.find('"', start)
        if stop < 0 or not text.startswith(_META, stop):
            continue
        try:
            schema, i = scanstring(text, stop + len(_META))
            if not text.startswith(_TABLE, i):
                continue
            table, i = scanstring(text, i + len(_TABLE))
        except ValueError:
            continue
        if f'"idempotency_key":"{key}"' in text[i:i + 200]:
            return f"{schema}.{table}", text[start:stop]
    return None
