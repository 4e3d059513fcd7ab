"""The Typesense sink's pure parts: a message's change, a document's id, a collection's schema."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from cdc_pipeline.sinks.typesense.documents import (
    Change,
    change_of,
    collection_schema,
    document_id,
    field_type,
    recreate_schema,
    route_problem,
)


def message(action: str, record: dict | None) -> bytes:
    return json.dumps({"record": record, "changes": None, "action": action,
                       "metadata": {"table_schema": "s", "table_name": "t", "idempotency_key": "1:0"}}).encode()


def test_changes() -> None:
    keys = {"s.t": ["a", "b"]}.get
    up = change_of(message("update", {"a": 1, "b": "x", "id": 9, "v": None}), keys)
    assert up == Change("upsert", "s.t", '[1,"x"]', '{"a":1,"b":"x","id":"[1,\\"x\\"]","v":null}')
    assert change_of(message("delete", {"a": 1, "b": "x"}), keys) == Change("delete", "s.t", '[1,"x"]')
    assert change_of(message("truncate", None), keys) == Change("truncate", "s.t")
    assert change_of(message("insert", {"id": 5}), lambda t: None).doc_id == "5"  # no known key: the id column
    assert "no value for its key" in str(change_of(message("insert", {"a": 1}), keys))
    assert change_of(b'{"id": "k", "x": 1}', keys) == Change("upsert", None, "k", '{"id":"k","x":1}')
    assert "must carry an `id`" in str(change_of(b'{"x": 1}', keys))
    assert "not JSON" in str(change_of(b"{", keys))


@given(st.lists(st.one_of(st.integers(), st.text(), st.floats(allow_nan=False)), min_size=1, max_size=3))
def test_document_ids_are_stable_and_distinct_per_key(values: list) -> None:
    record = {f"k{i}": v for i, v in enumerate(values)}
    columns = list(record)
    doc_id = document_id(record, columns)
    assert doc_id == document_id(dict(reversed(record.items())), columns)
    if len(values) > 1:
        assert json.loads(doc_id or "") == values


def test_field_types_and_schema() -> None:
    assert [field_type(t) for t in ("integer", "bigint", "numeric(10,2)", "character varying(20)", "text[]",
                                    "timestamp(3) with time zone", "boolean", "jsonb", "point")] == [
        "int32", "int64", "float", "string", "string[]", "string", "bool", None, None]
    schema = collection_schema("c", [("id", "integer"), ("n", "text"), ("j", "jsonb")])
    assert schema == {"name": "c", "fields": [{"name": "n", "type": "string", "optional": True}]}
    assert collection_schema("c", None)["fields"] == [{"name": ".*", "type": "auto"}]
    existing = {"name": "c", "created_at": 1, "num_documents": 3, "default_sorting_field": "",
                "fields": [{"name": "j", "type": "object"}, {"name": "j.a", "type": "int64"}]}
    assert recreate_schema(existing) == {"name": "c", "fields": [{"name": "j", "type": "object"}]}
    assert route_problem("x\n", None) and route_problem("a", ["b"]) and route_problem("ba", ["b"]) is None
