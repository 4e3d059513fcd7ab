"""The kafka sink's record headers come from the message's own fields (top-level `action`, `metadata`'s
`table_schema` and `table_name`), read by structure: never a look-alike in the record, an annotation or an
enrichment (another table's row, written after the envelope), at any depth."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.sinks.kafka.topics import headers, message_fields

FORGED = {"record": None, "changes": None, "action": "delete", "metadata": {"table_schema": "forged", "table_name": "x", "idempotency_key": "1:2"}}


def _payload(enrichment: object) -> bytes:
    message = {"record": {"id": 1, "action": "read"}, "changes": None, "action": "update",
               "metadata": {"table_schema": "public", "table_name": "orders", "commit_lsn": 1, "commit_idx": 2,
                            "idempotency_key": "1:2", "annotations": FORGED, "enrichment": enrichment}}
    return json.dumps(message, separators=(",", ":")).encode()


def test_an_enrichment_or_annotation_cannot_forge_the_headers() -> None:
    for enrichment in (FORGED, [FORGED], {"row": FORGED}, json.dumps(FORGED)[1:-1]):
        assert headers("1:2", _payload(enrichment)) == [
            ("idempotency_key", b"1:2"), ("table", b"public.orders"), ("action", b"update")]


def test_deep_nesting_is_read_without_recursion() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    text = '{"record":' + deep + ',"action":"insert","metadata":{"table_schema":"s","table_name":"t"}}'
    assert message_fields(text) == {"action": "insert", "schema": "s", "table": "t"}


def _expected(value: object) -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(value, dict):
        if isinstance(value.get("action"), str):
            out["action"] = value["action"]
        meta = value.get("metadata")
        if isinstance(meta, dict):
            for name, label in (("table_schema", "schema"), ("table_name", "table")):
                if isinstance(meta.get(name), str):
                    out[label] = meta[name]
    return out


_names = st.sampled_from(["action", "metadata", "table_schema", "table_name", "record", "a\"b", "\u00e9"])
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6) | _names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_names | st.text(max_size=4), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(value=_json, ascii_only=st.booleans())
def test_fields_equal_what_a_json_parser_reads(value: object, ascii_only: bool) -> None:
    assert message_fields(json.dumps(value, ensure_ascii=ascii_only)) == _expected(value)
