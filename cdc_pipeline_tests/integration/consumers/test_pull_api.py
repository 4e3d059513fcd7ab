"""Pull consumers' HTTP API: `cdc-pipeline serve` as a real process over a real state database.

Messages are queued through the http_pull sink's own code (the path the delivery engine uses) so these
tests exercise the API's semantics without a Spark run each; test_pull_load.py runs the whole pipeline.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from cdc_pipeline.admin import status
from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import OutboundMessage, SinkContext
from cdc_pipeline.state.schema import ensure_schema
from cdc_pipeline_tests.pull import Server, receive, settle

TOKEN = "s3cret-pull-token"


def pull_config(dsn: str, **dest: Any) -> dict[str, Any]:
    return {
        "source": {"dsn": dsn, "slot": "cdc_test", "publication": "cdc_test"},
        "tables": [{"name": "public.t"}],
        "sinks": [
            {"name": "orders", "tables": ["public.t"],
             "destination": {"type": "http_pull", "token_env": "PULL_TOKEN", **dest}},
            {"name": "mirror", "tables": ["public.t"],
             "destination": {"type": "postgres", "dsn": dsn, "table": "mirror.t"}},
        ],
    }


@pytest.fixture
def served(source_db: Any, tmp_path: Path) -> Iterator[Callable[..., tuple[PipelineConfig, Server]]]:
    servers: list[Server] = []

    def start(**dest: Any) -> tuple[PipelineConfig, Server]:
        path = tmp_path / "cdc.yaml"
        path.write_text(yaml.safe_dump(pull_config(source_db.dsn, **dest)))
        config = load_config(path)
        with psycopg.connect(config.state_dsn) as conn:
            ensure_schema(conn, config.state.schema_name)
        server = Server(path, {"PULL_TOKEN": TOKEN}).start()
        servers.append(server)
        return config, server

    yield start
    for s in servers:
        s.stop()


def enqueue(config: PipelineConfig, items: list[tuple[str | None, int]], start: int = 1) -> None:
    """Queue messages through the http_pull sink, committed: (group, seq) each."""
    context = SinkContext("orders", config.state.schema_name)
    sink = build_sink(config.sink("orders"), context=context)
    with psycopg.connect(config.state_dsn) as conn:
        context.state = conn  # what a delivery's session hands it: its state connection
        batch = [OutboundMessage(f"{start + i}:0", group, None,
                                 json.dumps({"record": {"group": group, "seq": seq}}).encode())
                 for i, (group, seq) in enumerate(items)]
        assert sink.deliver(batch) == [None] * len(batch)
        conn.commit()


def client(server: Server, token: str | None = TOKEN) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def seqs(items: list[dict]) -> list[tuple[str | None, int]]:
    return [(m["message"]["record"]["group"], m["message"]["record"]["seq"]) for m in items]


def test_receive_ack_nack_and_group_order(served):
    config, server = served()
    enqueue(config, [("a", 1), ("a", 2), ("b", 1), (None, 1), ("b", 2), (None, 2)])
    with client(server) as c:
        first = receive(c, "orders", 10)
        # Only each group's head goes out; ungrouped messages all flow.
        assert seqs(first) == [("a", 1), ("b", 1), (None, 1), (None, 2)]
        assert receive(c, "orders", 10) == []  # a2 and b2 wait behind outstanding heads
        by = {(m["message"]["record"]["group"], m["message"]["record"]["seq"]): m["ack_id"] for m in first}
        assert settle(c, "orders", [by[("a", 1)], by[(None, 1)], by[(None, 2)]]) == {"settled": 3, "stale": []}
        assert settle(c, "orders", [by[("b", 1)]], "nack") == {"settled": 1, "stale": []}
        second = receive(c, "orders", 10)
        assert seqs(second) == [("a", 2), ("b", 1)]  # nacked b1 is available again at once, before b2
        assert settle(c, "orders", [m["ack_id"] for m in second])["settled"] == 2
        third = receive(c, "orders", 10)
        assert seqs(third) == [("b", 2)]
        # A settled id is stale from then on; so is garbage.
        r = settle(c, "orders", [by[("a", 1)], "nonsense", "99999999999999999999.1", third[0]["ack_id"]])
        assert r == {"settled": 1, "stale": [by[("a", 1)], "nonsense", "99999999999999999999.1"]}
        assert receive(c, "orders", 10) == []


def test_visibility_timeout_redelivers_and_late_ack_is_stale(served):
    config, server = served(visibility_timeout_ms=400)
    enqueue(config, [("g", 1), ("g", 2)])
    with client(server) as c:
        [m] = receive(c, "orders", 10)
        assert receive(c, "orders", 10) == []  # leased
        time.sleep(0.5)
        [again] = receive(c, "orders", 10)
        assert seqs([again]) == [("g", 1)] and again["ack_id"] != m["ack_id"]
        assert settle(c, "orders", [m["ack_id"]]) == {"settled": 0, "stale": [m["ack_id"]]}
        time.sleep(0.5)  # this lease expired too, not yet handed out again: still stale
        assert settle(c, "orders", [again["ack_id"]]) == {"settled": 0, "stale": [again["ack_id"]]}
        [third] = receive(c, "orders", 10)
        assert settle(c, "orders", [third["ack_id"]])["settled"] == 1
        assert seqs(receive(c, "orders", 10)) == [("g", 2)]


def test_max_deliveries_parks_and_holds_its_group(served):
    config, server = served(max_deliveries=2)
    enqueue(config, [("p", 1), ("p", 2), ("q", 1)])
    with client(server) as c:
        for _ in range(2):
            got = receive(c, "orders", 10)
            assert ("p", 1) in seqs(got)
            settle(c, "orders", [m["ack_id"] for m in got if m["message"]["record"]["group"] == "p"], "nack")
            q = [m["ack_id"] for m in got if m["message"]["record"]["group"] == "q"]
            if q:
                settle(c, "orders", q)
        assert receive(c, "orders", 10) == []  # p1 came back a third time: parked, p2 held behind it
    with psycopg.connect(config.state_dsn) as conn:
        rows = conn.execute("SELECT payload::json->'record'->>'seq', parked, deliveries FROM cdc_pipeline.pull_queue "
                            "WHERE consumer = 'orders' ORDER BY id").fetchall()
    assert rows == [("1", True, 2), ("2", False, 0)]  # q1 acked; p1 parked after 2 deliveries
    assert status.collect(config)["sinks"]["orders"]["pull_queue"] == {"waiting": 1, "in_flight": 0, "parked": 1}


def test_parked_pull_messages_in_failed_list_retry_and_discard(served, capsys):
    """`failed list|retry|discard` reach an http_pull sink's parked messages like any sink's."""
    from cdc_pipeline.cli import main as cli_main

    config, server = served(max_deliveries=1)
    enqueue(config, [("p", 1), ("p", 2), ("q", 1)])
    cli = ["--config", str(config.path), "failed"]

    def park_head(c: httpx.Client) -> None:  # handed out once, nacked, parked when it would go out again
        got = receive(c, "orders", 10)
        settle(c, "orders", [m["ack_id"] for m in got if m["message"]["record"]["group"] == "p"], "nack")
        settle(c, "orders", [m["ack_id"] for m in got if m["message"]["record"]["group"] == "q"])
        assert receive(c, "orders", 10) == []

    with client(server) as c:
        park_head(c)
        capsys.readouterr()
        assert cli_main([*cli, "list", "--json"]) == 0
        [item] = json.loads(capsys.readouterr().out)
        assert (item["sink"], item["id"], item["group_key"], item["status"]) == ("orders", "1:0", "p", "parked")
        assert cli_main([*cli, "list"]) == 0
        assert "orders 1:0 group=p parked attempts=1" in capsys.readouterr().out
        assert cli_main([*cli, "retry", "1:0"]) == 0  # available again, its delivery count from zero
        assert "1 message(s) due for retry now" in capsys.readouterr().out
        assert seqs(receive(c, "orders", 10, wait_for_ms=2000)) == [("p", 1)]
        assert receive(c, "orders", 10) == []  # p2 still behind it
        # Its lease ends now (not acked): it parks again on its next way out.
        with psycopg.connect(config.state_dsn) as conn:
            conn.execute("UPDATE cdc_pipeline.pull_queue SET visible_at = now() WHERE consumer = 'orders'")
        assert receive(c, "orders", 10) == []
        assert cli_main([*cli, "discard", "--all", "--sink", "orders"]) == 0
        assert "1 message(s) discarded" in capsys.readouterr().out
        assert seqs(receive(c, "orders", 10, wait_for_ms=2000)) == [("p", 2)]  # its group flows on
    assert cli_main([*cli, "retry", "1:0"]) == 1  # nothing matches any more
    assert status.collect(config)["sinks"]["orders"]["pull_queue"]["parked"] == 0


def test_long_poll_wakes_when_messages_are_queued(served):
    config, server = served()
    with client(server) as c:
        t0 = time.monotonic()
        assert receive(c, "orders", 5, wait_for_ms=300) == []
        assert time.monotonic() - t0 >= 0.29  # waited
        timer = threading.Timer(0.5, enqueue, (config, [("w", 1)]))
        timer.start()
        t0 = time.monotonic()
        got = receive(c, "orders", 5, wait_for_ms=10_000)
        waited = time.monotonic() - t0
        timer.join()
        assert seqs(got) == [("w", 1)] and 0.4 < waited < 3


def test_auth_unknown_consumer_and_bad_bodies(served):
    config, server = served()
    enqueue(config, [("x", 1)])
    body = {"batch_size": 1}
    with client(server, token=None) as anon, client(server, token="wrong") as wrong, client(server) as c:
        r = anon.post("/api/consumers/orders/receive", json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert wrong.post("/api/consumers/orders/receive", json=body).status_code == 401
        assert wrong.post("/api/consumers/orders/ack", json={"ack_ids": ["1.1"]}).status_code == 401
        assert TOKEN not in r.text
        r = c.post("/api/consumers/nobody/receive", json=body)
        assert r.status_code == 404 and "nobody" in r.json()["detail"]
        # The postgres sink is not a pull consumer.
        assert c.post("/api/consumers/mirror/receive", json=body).status_code == 404
        for bad, field in [({"batch_size": 0}, "batch_size"), ({"batch_size": "many"}, "batch_size"),
                           ({"wait_for_ms": -1}, "wait_for_ms"), ({"batch_size": 1, "extra": 1}, "extra")]:
            r = c.post("/api/consumers/orders/receive", json=bad)
            assert r.status_code == 422, r.text
            assert field in json.dumps(r.json()["detail"])
        for verb in ("ack", "nack"):
            assert c.post(f"/api/consumers/orders/{verb}", json={"ack_ids": []}).status_code == 422
            assert c.post(f"/api/consumers/orders/{verb}", json={}).status_code == 422
            assert c.post(f"/api/consumers/orders/{verb}", content=b"{not json").status_code == 422
        assert seqs(receive(c, "orders", 1)) == [("x", 1)]  # none of that disturbed the queue


def test_fast_path_answers_exactly_as_the_fastapi_routes(served):
    """serve answers well-formed authorized requests without FastAPI's routing (consumers/fastpath.py);
    a lower-case scheme or a charset parameter takes FastAPI's own path: both must answer the same."""
    config, server = served()
    enqueue(config, [("a", 1), ("b", 1), ("a", 2), ("b", 2)])
    fast = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    routed = {"Authorization": f"bearer {TOKEN}", "Content-Type": "application/json; charset=utf-8"}
    bodies: list[tuple[str, Any]] = [
        ("receive", {"batch_size": 0}), ("receive", {"batch_size": 1.5, "wait_for_ms": "7"}),
        ("receive", {"batch_size": 1, "x": 1}), ("receive", [1]), ("receive", "{"), ("ack", {"ack_ids": []}),
        ("ack", {"ack_ids": ["1.1", "nonsense", "\ud800", "x" * 65]}), ("nack", {"ack_ids": ["7.0", "1.1"]}),
        ("ack", {"ack_ids": ["\ud800"]}), ("nack", {}), ("ack", None)]
    with client(server) as c:
        for verb, body in bodies:
            raw = body if isinstance(body, str) else json.dumps(body)
            answers = [c.post(f"/api/consumers/orders/{verb}", content=raw.encode(), headers=h) for h in (fast, routed)]
            assert answers[0].status_code == answers[1].status_code < 500, (verb, body, answers[0].text)
            assert answers[0].json() == answers[1].json(), (verb, body)
            assert answers[0].headers["content-type"] == answers[1].headers["content-type"]
        # The state changing ones: the same messages, in the same shape, whichever path.
        got = []
        for h in (fast, routed, fast, routed):
            r = c.post("/api/consumers/orders/receive", json={"batch_size": 1}, headers=h)
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            [item] = r.json()["data"]
            assert set(item) == {"ack_id", "message"}
            got.append((item["message"]["record"]["group"], item["message"]["record"]["seq"]))
            verb = "ack" if len(got) % 2 else "nack"
            r = c.post(f"/api/consumers/orders/{verb}", json={"ack_ids": [item["ack_id"]]}, headers=h)
            assert r.json() == {"settled": 1, "stale": []}
        assert got == [("a", 1), ("b", 1), ("b", 1), ("a", 2)]  # nacked b1 again, before the later a2
        rest = c.post("/api/consumers/orders/receive", json={"batch_size": 9}, headers=fast).json()["data"]
        assert seqs(rest) == [("a", 2), ("b", 2)]
        assert settle(c, "orders", [m["ack_id"] for m in rest]) == {"settled": 2, "stale": []}
        for h in (fast, routed):  # an empty long-poll, both ways
            r = c.post("/api/consumers/orders/receive", json={"batch_size": 5, "wait_for_ms": 50}, headers=h)
            assert r.json() == {"data": []}


def test_server_survives_clients_that_disconnect(served):
    config, server = served()
    body = json.dumps({"batch_size": 1, "wait_for_ms": 5000}).encode()
    head = (f"POST /api/consumers/orders/receive HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    for payload in (head + body, head + body[:5], head[:20]):  # mid-long-poll, mid-body, mid-headers
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(payload)
            time.sleep(0.3)
    time.sleep(0.3)
    enqueue(config, [("d", 1)])
    with client(server) as c:
        # The abandoned long-poll handed nothing out: the message is there for the next client.
        assert seqs(receive(c, "orders", 5)) == [("d", 1)]
    assert server.proc is not None and server.proc.poll() is None


def test_openapi_fuzzed_by_schemathesis_finds_no_server_errors(served):
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

    config, server = served(visibility_timeout_ms=1000)
    enqueue(config, [(f"g{i % 7}", i) for i in range(200)])
    spec = httpx.get(server.url + "/openapi.json").json()
    assert set(spec["paths"]) == {f"/api/consumers/{{name}}/{v}" for v in ("receive", "ack", "nack")}
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    calls: list[int] = []

    def check(case: Any) -> None:
        if isinstance(case.body, dict) and isinstance(case.body.get("wait_for_ms"), int):
            case.body["wait_for_ms"] = min(case.body["wait_for_ms"], 200)  # bound the long-polls
        for name in (case.path_parameters["name"], "orders"):  # a fuzzed name (404) and the real one
            case.path_parameters = {"name": name}
            response = case.call(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
            calls.append(response.status_code)
            case.validate_response(response, checks=[not_a_server_error, response_schema_conformance,
                                                     content_type_conformance])

    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):  # valid bodies, and invalid ones
            strategy = operation.as_strategy(generation_mode=mode)
            settings(max_examples=25, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))(given(strategy)(check))()
    assert len(calls) >= 150 and max(calls) < 500
    assert {200, 404, 422} <= set(calls)


def test_serve_refuses_to_start_without_its_token(tmp_path, capsys, monkeypatch):
    from cdc_pipeline.cli import main as cli_main

    monkeypatch.delenv("PULL_TOKEN", raising=False)
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(pull_config("postgresql://nobody@127.0.0.1:1/none")))
    assert cli_main(["serve", "--config", str(path), "--port", "0"]) == 1
    assert "environment variable PULL_TOKEN (token_env) is not set" in capsys.readouterr().err
