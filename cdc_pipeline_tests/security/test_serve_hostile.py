"""`cdc-pipeline serve` against hostile clients (issue 21, items 9 and 10), as a real process over raw
sockets: a request is authenticated before its body is read, every body is bounded, and the answers
never tell an unauthenticated caller which consumers exist."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.state.schema import ensure_schema
from cdc_pipeline_tests.integration.consumers.test_pull_api import TOKEN, enqueue, pull_config
from cdc_pipeline_tests.pull import Server, receive

AUDIT_TOKEN = "another-consumers-token"
MAX_BODY = 1024 * 1024  # the documented bound of a request body


@pytest.fixture
def two_consumers(source_db: Any, tmp_path: Path) -> Iterator[tuple[PipelineConfig, Server]]:
    data = pull_config(source_db.dsn)
    data["sinks"].append({"name": "audit", "tables": ["public.t"],
                          "destination": {"type": "http_pull", "token_env": "AUDIT_TOKEN"}})
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    with psycopg.connect(config.state_dsn) as conn:
        ensure_schema(conn, config.state.schema_name)
    server = Server(path, {"PULL_TOKEN": TOKEN, "AUDIT_TOKEN": AUDIT_TOKEN}).start()
    try:
        yield config, server
    finally:
        server.stop()


def rss_kb(server: Server) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def answer(sock: socket.socket, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """The response's status, headers and body, read within ``timeout`` (else the server never answered)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def post_head(path: str, token: str | None, length: int | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n{size}\r\n").encode()


@pytest.mark.parametrize("token", [None, "wrong"])
@pytest.mark.parametrize("name", ["orders", "nobody"])
def test_a_huge_body_without_the_token_is_refused_before_it_is_read(two_consumers, token, name):
    _, server = two_consumers
    before = rss_kb(server)
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(post_head(f"/api/consumers/{name}/receive", token, 400_000_000))
        # A 400 MB body begins; the answer must not wait for the rest. The server may answer and close before
        # this part is written: as expected.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"x" * 1_000_000)
        status, headers, body = answer(s)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(body) == {"detail": "missing or wrong bearer token"}
    assert rss_kb(server) - before < 20_000


def test_every_body_is_bounded_even_with_the_token(two_consumers):
    config, server = two_consumers
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # announced too long: not read at all
        s.sendall(post_head("/api/consumers/orders/ack", TOKEN, 100_000_000))
        status, headers, body = answer(s)
        assert status == 413 and str(MAX_BODY) in json.loads(body)["detail"]
    before = rss_kb(server)
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # chunked: cut once past the bound
        s.sendall(post_head("/api/consumers/orders/ack", TOKEN, None))
        chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        status = 0
        try:
            for _ in range(800):  # 50 MB if nobody stops it
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: what is expected
        status, _, _ = answer(s)
        assert status == 413
    assert rss_kb(server) - before < 20_000
    # Off the consumer routes too: a body to an unknown path is not read past the bound.
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(post_head("/elsewhere", TOKEN, 100_000_000))
        assert answer(s)[0] == 413
    # The largest legitimate request still passes: 10,000 ack ids.
    enqueue(config, [("a", 1)])
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        ids = [f"{10**18 + i}.{i % 7}" for i in range(10_000)]
        r = c.post("/api/consumers/orders/ack", json={"ack_ids": ids})
        assert r.status_code == 200 and r.json()["settled"] == 0
        assert [m["message"]["record"]["seq"] for m in receive(c, "orders", 5)] == [1]
    assert server.proc is not None and server.proc.poll() is None


def test_answers_do_not_tell_who_exists(two_consumers):
    _, server = two_consumers
    answers = {}
    for name in ("orders", "audit", "nobody", "mirror"):  # two consumers, an unknown name, a push sink
        for token in (None, "wrong", "x" * 500):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            for verb, body in (("receive", {"batch_size": 1}), ("ack", {"ack_ids": ["1.1"]})):
                r = httpx.post(f"{server.url}/api/consumers/{name}/{verb}", json=body, headers=headers, timeout=10)
                answers[(name, token, verb)] = (r.status_code, r.text, r.headers.get("www-authenticate"))
    assert set(answers.values()) == {(401, '{"detail":"missing or wrong bearer token"}', "Bearer")}
    # Another consumer's token opens only that consumer; a valid token learns that a name is unknown.
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {AUDIT_TOKEN}"}, timeout=10) as c:
        assert c.post("/api/consumers/orders/receive", json={"batch_size": 1}).status_code == 401
        assert c.post("/api/consumers/audit/receive", json={"batch_size": 1}).status_code == 200
        assert c.post("/api/consumers/nobody/receive", json={"batch_size": 1}).status_code == 404
