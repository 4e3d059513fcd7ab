"""A hostile webhook endpoint (issues 15.6, 15.7), as a real local TCP server: echoed secrets are masked and
control characters escaped; a huge body is read only a few KB; a trickling endpoint is cut at `timeout_ms`
for the whole request, not per read."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

from cdc_pipeline.config import WebhookDestination
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.http_guard import MAX_ERROR_BODY
from cdc_pipeline_tests.helpers import wait_until
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages
from cdc_pipeline_tests.scheduled import scheduled

Handler = Callable[[socket.socket, bytes], None]


class RawServer:
    """Reads one HTTP request per connection (headers + Content-Length body), then hands the socket to
    `handler`, which writes whatever response it likes, as slowly as it likes."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sent = 0
        self.stopped = threading.Event()
        self.handled = threading.Event()  # a handler returned: it wrote everything, or the client hung up
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            with contextlib.suppress(OSError):  # the client hung up: what the deadline is for
                self.handler(conn, head)
            self.handled.set()

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()


@pytest.fixture
def server() -> Iterator[Callable[[Handler], RawServer]]:
    made: list[RawServer] = []

    def make(handler: Handler) -> RawServer:
        made.append(RawServer(handler))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def webhook(url: str, **kw: object):
    config = SimpleNamespace(name="hook", destination=WebhookDestination(url=url, **kw))
    return scheduled(build_sink(config, environ={"HOOK_SECRET": "hmac-s3cret-value"}), config.destination)


def test_echoed_secrets_are_masked_and_controls_escaped(server) -> None:
    holder: dict[str, RawServer] = {}

    def echo(conn: socket.socket, head: bytes) -> None:
        # Echo the request line and every header back, plus a forged log line and a terminal escape.
        body = b"\x1b[2J\x07\n2026-01-01 INFO all good\n" + head
        holder["s"].send(conn, b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    s = holder["s"] = server(echo)
    url = f"http://127.0.0.1:{s.port}/hooks/PathT0kenSecret42/in?token=QueryT0kenSecret&x=1"
    with webhook(url, headers={"Authorization": "Bearer BearerT0kenSecret"}, hmac_secret_env="HOOK_SECRET") as sink:
        results = sink.deliver(messages(1, groups=0))
    error = results[0]
    assert error is not None and error.startswith("HTTP 404: ")
    for secret in ("PathT0kenSecret42", "QueryT0kenSecret", "BearerT0kenSecret"):
        assert secret not in error
    assert "\x1b" not in error and "\x07" not in error and "\n" not in error and "\r" not in error
    assert "\\x1b" in error and "\\n" in error


def test_a_huge_error_body_is_read_only_a_few_kb(server) -> None:
    holder: dict[str, RawServer] = {}

    def huge(conn: socket.socket, head: bytes) -> None:
        total = 200 * 1024 * 1024
        holder["s"].send(conn, b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % total)
        chunk = b"x" * 65536
        for _ in range(total // len(chunk)):
            holder["s"].send(conn, chunk)

    s = holder["s"] = server(huge)
    with webhook(f"http://127.0.0.1:{s.port}/h", timeout_ms=60000) as sink:
        results = sink.deliver(messages(1, groups=0))
    assert results[0] is not None and results[0].startswith("HTTP 400: x")
    # The client stopped reading after a few KB and hung up: the server's writes failed after little more
    # than the socket buffers (a client reading it all would take the 200 MB).
    wait_until(s.handled.is_set, 60, "the server to see the client hang up")
    assert s.sent < 20 * 1024 * 1024, s.sent
    assert MAX_ERROR_BODY <= 8192


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickling_endpoint_is_cut_at_the_total_deadline(server, where) -> None:
    holder: dict[str, RawServer] = {}

    response = b"HTTP/1.1 500 Oops\r\nContent-Length: 40\r\n\r\n" + b"e" * 40  # 10 s or more to trickle

    def trickle(conn: socket.socket, head: bytes) -> None:
        split = 5 if where == "headers" else response.index(b"\r\n\r\n") + 4
        holder["s"].send(conn, response[:split])
        for byte in response[split:]:
            time.sleep(0.25)  # well inside the per-read timeout, forever in total
            holder["s"].send(conn, bytes([byte]))

    s = holder["s"] = server(trickle)
    with webhook(f"http://127.0.0.1:{s.port}/h", timeout_ms=1000) as sink:
        results = sink.deliver(messages(1, groups=0))
    assert results[0] is not None and results[0].startswith("timeout:"), results[0]
    # Cut mid-response: a per-read timeout would have read the trickle to its end.
    wait_until(s.handled.is_set, 60, "the server to see the client hang up")
    assert s.sent < len(response), s.sent


def test_timestamped_signature_lets_a_receiver_refuse_replays() -> None:
    """A real receiver that does what the README asks: verify the HMAC over `<timestamp>.<body>` and refuse a
    request whose timestamp is old (a captured request replayed later)."""
    import hashlib
    import hmac

    from cdc_pipeline_tests.integration.sinks.test_sink_webhook import Receiver

    secret = "hmac-s3cret-value"  # what webhook() puts in HOOK_SECRET
    receiver = Receiver()

    def verify(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        ts = headers.get("x-cdc-timestamp", "")
        expected = hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(headers.get("x-cdc-signature-v2", ""), expected):
            return 400, b"bad signature", 0.0
        if abs(time.time() - int(ts)) > 300:
            return 400, b"stale", 0.0
        # The body-only signature is still sent, unchanged, for receivers that check it.
        assert headers["x-cdc-signature"] == hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return 200, b"{}", 0.0

    receiver.behaviour = verify
    try:
        with webhook(receiver.url, hmac_secret_env="HOOK_SECRET") as sink:
            assert sink.deliver(messages(3, groups=0)) == [None] * 3
        headers, body, status = receiver.requests[0]
        assert status == 200
        # Replaying the captured request later (its timestamp now old, or changed without the secret) fails.
        import httpx

        old = dict(headers, **{"x-cdc-timestamp": str(int(headers["x-cdc-timestamp"]) - 3600)})
        replay = httpx.post(receiver.url, content=body, headers={k: v for k, v in old.items()
                                                                 if k not in ("content-length", "host")})
        assert replay.status_code == 400
    finally:
        receiver.stop()
