"""Pure parts of the Typesense sink: what a message does to which document, and a collection's schema from
its table's columns. No I/O.

* A message in the pipeline's shape (`record`, `action`, `metadata`): insert, update and read upsert the
  record as a document, delete deletes the document, truncate empties the collection. A transform's own
  shape (no `action`) is a document upserted as it is, and must carry an `id`.
* A document's `id` is the row's primary key: its value as text for one column, a JSON array of the values
  for several; without a known key, the record's `id` column. A column named `id` that is not the key is
  replaced by it.
* The schema declares the columns whose type Typesense can index (integers, floats, booleans, text-like
  and time types as strings, and arrays of them), all optional (nullable); other columns (json, ...) are
  stored in the document, not indexed. Without the table's columns: one `.*` field of type `auto`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_SCALARS = {
    "smallint": "int32", "integer": "int32", "bigint": "int64", "real": "float", "double precision": "float",
    "numeric": "float", "boolean": "bool", "text": "string", "character varying": "string", "character": "string",
    "uuid": "string", "citext": "string", "date": "string", "timestamp without time zone": "string",
    "timestamp with time zone": "string", "time without time zone": "string", "time with time zone": "string",
    "inet": "string", "cidr": "string", "interval": "string", "name": "string",
}
MAX_ROUTE_CHARS = 256


@dataclass(frozen=True, slots=True)
class Change:
    op: str  # "upsert", "delete" or "truncate"
    table: str | None  # schema.table, when the message says
    doc_id: str | None = None
    line: str | None = None  # the document as one JSON line (upsert)


def change_of(payload: bytes, keys_of: Callable[[str], Sequence[str] | None]) -> Change | str:
    """What a message does, or why it cannot be applied (its own failure). `keys_of` gives a table's key
    columns (None: not known)."""
    try:
        message = json.loads(payload)
    except ValueError:
        return "typesense: the message is not JSON"
    if not isinstance(message, dict):
        return "typesense: the message is not a JSON object"
    if "action" not in message or "record" not in message:  # a transform's own shape: the document itself
        if "id" not in message or message["id"] is None:
            return "typesense: a transformed message must carry an `id`"
        return Change("upsert", None, _text(message["id"]), _line({**message, "id": _text(message["id"])}))
    meta = message.get("metadata") or {}
    table = f"{meta['table_schema']}.{meta['table_name']}" if "table_schema" in meta and "table_name" in meta else None
    action = message["action"]
    if action == "truncate":
        return Change("truncate", table)
    record = message.get("record")
    if not isinstance(record, dict):
        return f"typesense: a {action} message without a record"
    key_columns = keys_of(table) if table else None
    doc_id = document_id(record, key_columns)
    if doc_id is None:
        return f"typesense: the record has no value for its key ({', '.join(key_columns or ['id'])})"
    if action == "delete":
        return Change("delete", table, doc_id)
    return Change("upsert", table, doc_id, _line({**record, "id": doc_id}))


def document_id(record: dict[str, Any], key_columns: Sequence[str] | None) -> str | None:
    columns = list(key_columns) if key_columns else ["id"]
    values = [record.get(c) for c in columns]
    if any(v is None for v in values):
        return None
    return _text(values[0]) if len(values) == 1 else json.dumps(values, separators=(",", ":"), ensure_ascii=False)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _line(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def field_type(type_sql: str) -> str | None:
    """The Typesense type of a PostgreSQL column type, or None (stored, not indexed)."""
    base = type_sql.strip()
    array = base.endswith("[]")
    base = base.removesuffix("[]")
    if "(" in base:  # typmods: varchar(20), numeric(10,2), timestamp(3) with time zone
        head, _, tail = base.partition("(")
        base = (head.strip() + " " + tail.partition(")")[2].strip()).strip()
    kind = _SCALARS.get(base)
    return None if kind is None else kind + ("[]" if array else "")


def collection_schema(name: str, columns: Sequence[tuple[str, str]] | None) -> dict[str, Any]:
    """The schema of a new collection from its table's (column, type) pairs (see the module doc)."""
    if columns is None:
        return {"name": name, "fields": [{"name": ".*", "type": "auto"}]}
    fields = [{"name": col, "type": kind, "optional": True}
              for col, type_sql in columns if col != "id" and (kind := field_type(type_sql)) is not None]
    return {"name": name, "fields": fields or [{"name": ".*", "type": "auto"}]}


def recreate_schema(existing: dict[str, Any]) -> dict[str, Any]:
    """The creation request of a collection as it is now (to empty it: drop, then create it again)."""
    keep = ("name", "fields", "default_sorting_field", "token_separators", "symbols_to_index",
            "enable_nested_fields")
    schema = {k: existing[k] for k in keep if k in existing and existing[k] not in ("", None)}
    schema["fields"] = [{k: v for k, v in f.items() if k in ("name", "type", "optional", "facet", "index", "sort",
                                                              "infix", "locale")}
                        for f in existing.get("fields", []) if "." not in f["name"] or f["name"] == ".*"]
    return schema


def route_problem(route: str | None, allowed_prefixes: Sequence[str] | None) -> str | None:
    """Why a route cannot name a collection (None when it can or is None)."""
    if route is None:
        return None
    shown = repr(route[:80]).encode("unicode_escape").decode("ascii")
    if not route or len(route) > MAX_ROUTE_CHARS or not route.isprintable():
        return f"invalid collection name {shown}: 1-{MAX_ROUTE_CHARS} printable characters"
    if allowed_prefixes is not None and not any(route.startswith(p) for p in allowed_prefixes):
        return f"collection {shown} is outside the sink's route_prefixes ({', '.join(allowed_prefixes)})"
    return None
