"""Webhook sink against a real local HTTP server (http.server on 127.0.0.1, port 0, in a thread)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_pipeline.config import WebhookDestination
from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import NOT_SENT, OutboundMessage, SinkConfigError, SinkUnavailable
from cdc_pipeline.sinks.webhook.client import WebhookSink
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages
from cdc_pipeline_tests.scheduled import scheduled

# (headers, body) -> (status, response body, seconds to wait before answering)
Behaviour = Callable[[dict[str, str], bytes], tuple[int, bytes, float]]


def ok(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
    return 200, b"{}", 0.0


class Receiver:
    """Records every request; answers as `behaviour` says."""

    def __init__(self) -> None:
        self.behaviour: Behaviour = ok
        self.requests: list[tuple[dict[str, str], bytes, int]] = []  # headers, body, status answered
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the sink expects

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, answer, delay = receiver.behaviour(headers, body)
                if delay:
                    time.sleep(delay)
                with receiver.lock:
                    receiver.requests.append((headers, body, status))
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sink gave up waiting (timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # http.server's listen backlog of 5 drops a window's concurrent connects (SYNs retried after 1 s,
        # past a short timeout_ms); a real endpoint's is in the hundreds.
        self.server.socket.listen(1024)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/cdc?token=abc"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def acked_keys(self) -> list[str]:
        """Idempotency keys of the messages in requests answered 2xx, in arrival order."""
        return [m["metadata"]["idempotency_key"] for _, body, status in self.requests if 200 <= status < 300
                for m in json.loads(body)["data"]]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def webhook(url: str, environ: dict[str, str] | None = None, **kw: Any) -> Any:
    """The sink as the engine's calls use it (cdc_pipeline_tests/scheduled.py)."""
    config = SimpleNamespace(name="hook", destination=WebhookDestination(url=url, **kw))
    sink = build_sink(config, environ=environ or {})
    assert isinstance(sink, WebhookSink)
    return scheduled(sink, config.destination)


def keys(batch: list[OutboundMessage]) -> list[str]:
    return [json.loads(m.payload)["metadata"]["idempotency_key"] for m in batch]


def test_chunks_arrive_complete_in_order_with_exact_bytes(receiver: Receiver) -> None:
    batch = messages(25, groups=3)  # every chunk shares groups with the next: sent one after another
    with webhook(receiver.url, headers={"Authorization": "Bearer t0ken-value", "X-Tenant": "acme"},
                 batch_size=10) as sink:
        assert sink.deliver(batch) == [None] * 25
    assert len(receiver.requests) == 3
    for (headers, body, _), chunk in zip(receiver.requests, (batch[:10], batch[10:20], batch[20:]), strict=True):
        assert body == b'{"data":[' + b",".join(m.payload for m in chunk) + b"]}"  # not re-serialised
        assert headers["content-type"] == "application/json"
        assert headers["authorization"] == "Bearer t0ken-value" and headers["x-tenant"] == "acme"
        assert "x-cdc-signature" not in headers
    assert receiver.acked_keys() == keys(batch)


def test_chunks_with_disjoint_groups_go_concurrently(receiver: Receiver) -> None:
    in_flight, most = [0], [0]
    overlapped = threading.Event()

    def meet(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        """Each request waits (up to 5 s, inside the sink's timeout) for another one to arrive beside it."""
        with receiver.lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            if in_flight[0] >= 2:
                overlapped.set()
        overlapped.wait(5)
        with receiver.lock:
            in_flight[0] -= 1
        return 200, b"{}", 0.0

    receiver.behaviour = meet
    batch = messages(40, groups=0)  # ungrouped: any chunks may overlap in time
    with webhook(receiver.url, batch_size=10) as sink:
        assert sink.deliver(batch) == [None] * 40
    assert most[0] >= 2, "the four chunks were sent one after another"
    assert sorted(receiver.acked_keys()) == sorted(keys(batch))


def test_hmac_signature_verifies(receiver: Receiver) -> None:
    secret = "whsec_0123456789abcdef"
    with webhook(receiver.url, environ={"CDC_HOOK_SECRET": secret}, hmac_secret_env="CDC_HOOK_SECRET",
                 signature_header="X-Hub-Signature") as sink:
        assert sink.deliver(messages(5)) == [None] * 5
    (headers, body, _), = receiver.requests
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["x-hub-signature"], expected)


@pytest.mark.parametrize("environ, state", [({}, "is not set"), ({"CDC_HOOK_SECRET": ""}, "is empty")])
def test_missing_secret_names_the_variable(receiver: Receiver, environ: dict[str, str], state: str) -> None:
    sink = webhook(receiver.url, environ=environ, hmac_secret_env="CDC_HOOK_SECRET")
    with pytest.raises(SinkConfigError, match=f"CDC_HOOK_SECRET .*{state}"):
        sink.open()
    assert receiver.requests == []


def test_500_for_one_group_fails_only_that_group(receiver: Receiver) -> None:
    batch = messages(64, groups=8)
    bad = {m.key for m in batch if m.group == "g3"}
    bad_payloads = [m.payload for m in batch if m.key in bad]
    receiver.behaviour = lambda h, b: ((500, b'{"error":"boom"}', 0.0) if any(p in b for p in bad_payloads)
                                       else (200, b"{}", 0.0))
    with webhook(receiver.url, batch_size=32) as sink:
        results = deliver_in_order(sink, batch)
    failed = [i for i, m in enumerate(batch) if m.key in bad]
    assert results[failed[0]] == 'HTTP 500: {"error":"boom"}'
    assert all(results[i] == HELD for i in failed[1:])  # order: g3 stops at its first failure
    assert all(results[i] is None for i, m in enumerate(batch) if m.key not in bad)
    good = [k for m, k in zip(batch, keys(batch), strict=True) if m.key not in bad]
    assert receiver.acked_keys() == good  # each good message acknowledged once, in order


def test_one_poison_message_does_not_fail_its_neighbours(receiver: Receiver) -> None:
    batch = messages(100, groups=10)
    poison = batch[37].payload
    receiver.behaviour = lambda h, b: (422, b"unprocessable " * 40, 0.0) if poison in b else (200, b"{}", 0.0)
    with webhook(receiver.url, batch_size=100) as sink:
        raw = sink.deliver(batch)
        assert raw[:37] == [None] * 37 and raw[38:] == [NOT_SENT] * 62  # the sink stops at the failure
        first_call = len(receiver.requests)
        results = deliver_in_order(sink, batch[37:])  # the engine hands back what may follow
    assert raw[37] is not None and raw[37].startswith("HTTP 422: unprocessable")
    assert len(raw[37]) == len("HTTP 422: ") + 200  # the body is cut to 200 characters
    assert first_call < 20  # bisection: about log2(100) requests, not one per message
    group = batch[37].group
    for i, m in enumerate(batch[37:], start=37):
        if i > 37 and m.group == group:
            assert results[i - 37] == HELD  # never accepted by the receiver
        elif i != 37:
            assert results[i - 37] is None
    held = {k for i, (k, m) in enumerate(zip(keys(batch), batch, strict=True)) if i > 37 and m.group == group}
    assert held.isdisjoint(receiver.acked_keys())
    assert len(receiver.requests) < 30


def test_timeout_fails_the_chunk_without_bisecting(receiver: Receiver) -> None:
    arrivals: list[int] = []

    def slow(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        arrivals.append(len(json.loads(body)["data"]))
        return 200, b"{}", 1.0

    receiver.behaviour = slow
    with webhook(receiver.url, timeout_ms=200, batch_size=50) as sink:
        results = sink.deliver(messages(10, groups=0))
    assert all(r is not None and r.startswith("timeout: no response") and "200 ms" in r for r in results)
    assert arrivals == [10]  # one request for the chunk, not bisected into more
    assert "token=abc" not in results[0]  # the URL's query may hold a token




def test_dns_failure_is_unavailable() -> None:
    sink = webhook("http://cdc-pipeline-no-such-host.invalid/hook", timeout_ms=3000)
    with sink, pytest.raises(SinkUnavailable):
        sink.deliver(messages(1))


def test_endpoint_wide_503_is_unavailable_and_never_leaks_secrets(receiver: Receiver) -> None:
    secret, token = "whsec_leakcheck", "Bearer leak-me-not"
    receiver.behaviour = lambda h, b: (503, json.dumps(h).encode(), 0.0)  # echoes our headers back
    sink = webhook(receiver.url, environ={"S": secret}, hmac_secret_env="S", headers={"Authorization": token},
                   batch_size=5)
    with sink, pytest.raises(SinkUnavailable) as info:
        sink.deliver(messages(20))
    assert len(receiver.requests) == 1  # no bisecting, no further chunks
    assert "HTTP 503" in str(info.value)
    assert secret not in str(info.value) and "leak-me-not" not in str(info.value)


def test_endpoint_going_down_mid_batch_fails_the_rest(receiver: Receiver) -> None:
    calls = {"n": 0}

    def first_ok_then_503(h: dict[str, str], b: bytes) -> tuple[int, bytes, float]:
        calls["n"] += 1
        return (200, b"{}", 0.0) if calls["n"] == 1 else (503, b"down", 0.0)

    receiver.behaviour = first_ok_then_503
    with webhook(receiver.url, batch_size=5) as sink:
        results = sink.deliver(messages(15, groups=1))
    assert results[:5] == [None] * 5
    assert all(r is not None and "HTTP 503" in r for r in results[5:])
    assert len(receiver.requests) == 2


def test_idempotency_key_header(receiver: Receiver) -> None:
    """The key travels in a header too, since a transform may drop it from the body (issue 9, smaller)."""
    batch = messages(4, groups=0)
    with webhook(receiver.url, batch_size=1) as sink:
        assert sink.deliver(batch[:2]) == [None, None]
    with webhook(receiver.url, batch_size=10) as sink:
        assert sink.deliver(batch[2:]) == [None, None]
    assert sorted(h["idempotency-key"] for h, _, _ in receiver.requests) == sorted([
        batch[0].key, batch[1].key, f"{batch[2].key}..{batch[3].key}"])  # the first two may race
