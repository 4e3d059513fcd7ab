"""The webhook over HTTP/2 (issue 23) against a real HTTP/2 server (hypercorn, TLS with a throwaway CA):
where the endpoint offers `h2`, the window's requests go as concurrent streams on one connection, in group
order, with a rejected message isolated, a late request cut at its deadline, and a new connection after the
server went away; where it offers only HTTP/1.1 (or `http2: false`), HTTP/1.1 as before."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
import trustme
from hypercorn.asyncio import serve
from hypercorn.config import Config

from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline_tests.integration.sinks.test_sink_webhook import keys, webhook
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages
from cdc_pipeline_tests.integration.sinks.test_webhook_window import acked_in_order

Decide = Callable[[list[str]], tuple[int, float]]  # the request's message keys -> (status, delay in seconds)


class H2Receiver:
    """An ASGI endpoint on hypercorn in its own thread: records each request's HTTP version, client
    port and message keys, and how many were in flight at once."""

    def __init__(self, tls: tuple[str, str], alpn: list[str], port: int = 0,
                 decide: Decide = lambda _: (200, 0.0)) -> None:
        self.decide = decide
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.peak = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        config = Config()
        config.bind = [f"fd://{os.dup(self._sock.fileno())}"]  # hypercorn closes its own copy
        config.certfile, config.keyfile = tls
        config.alpn_protocols = alpn
        config.loglevel = "WARNING"
        config.graceful_timeout = 1  # a request still out when stopped (the late one below) is not waited for long
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.call_soon(started.set)
            self._loop.run_until_complete(serve(self._app, config, shutdown_trigger=self._stop.wait))  # type: ignore[arg-type]

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        started.wait(10)

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}/hook"

    async def _app(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        got = [m["metadata"]["idempotency_key"] for m in json.loads(body)["data"]]
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        status, delay = self.decide(got)
        try:
            await asyncio.sleep(delay)
        finally:
            self.in_flight -= 1
        self.requests.append({"version": scope["http_version"], "client": scope["client"][1], "keys": got,
                              "status": status, "headers": {k.decode(): v.decode() for k, v in scope["headers"]}})
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok" if status < 300 else b"refused"})

    def acked_keys(self) -> list[str]:
        return [k for r in self.requests if r["status"] < 300 for k in r["keys"]]

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
        self._loop.close()
        self._sock.close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(server cert chain, server key, CA bundle) for localhost."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    chain, key, bundle = folder / "chain.pem", folder / "key.pem", folder / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(bundle))
    yield str(chain), str(key), str(bundle)


@pytest.fixture
def trusted(tls: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    monkeypatch.setenv("SSL_CERT_FILE", tls[2])  # the system's trust, as the sink reads it, plus our CA
    return tls[0], tls[1]


def _receiver(trusted: tuple[str, str], alpn: list[str], **kw: Any) -> H2Receiver:
    return H2Receiver(trusted, alpn, **kw)


def test_the_window_goes_as_concurrent_streams_on_one_connection_in_group_order(trusted: tuple[str, str]) -> None:
    server = _receiver(trusted, ["h2", "http/1.1"], decide=lambda _: (200, 0.02))
    try:
        batch = messages(300, groups=100)
        sink = webhook(server.url, batch_size=1, max_in_flight=50)
        sink.open()
        try:
            results = deliver_in_order(sink, batch)
        finally:
            sink.close()
        assert results == [None] * 300
        assert {r["version"] for r in server.requests} == {"2"}
        assert len({r["client"] for r in server.requests}) == 1, "one connection for the whole window"
        assert sorted(server.acked_keys()) == sorted(keys(batch))
        assert 10 < server.peak <= 50, f"{server.peak} streams in flight at once"
        acked_in_order(server, batch)  # type: ignore[arg-type]
    finally:
        server.stop()


def test_configured_headers_and_signatures_arrive_and_http1_only_ones_are_left_out(
        trusted: tuple[str, str]) -> None:
    server = _receiver(trusted, ["h2", "http/1.1"])
    try:
        sink = webhook(server.url, environ={"HOOK_SECRET": "s3cret"}, batch_size=5, hmac_secret_env="HOOK_SECRET",
                       headers={"X-Tenant": "acme", "Connection": "keep-alive", "Host": "elsewhere.example"})
        sink.open()
        try:
            assert deliver_in_order(sink, messages(10, groups=2)) == [None] * 10
        finally:
            sink.close()
        assert {r["version"] for r in server.requests} == {"2"}
        for r in server.requests:
            assert r["headers"]["x-tenant"] == "acme"
            assert len(r["headers"]["x-cdc-signature"]) == 64 and r["headers"]["idempotency-key"]
            assert "connection" not in r["headers"]
    finally:
        server.stop()


@pytest.mark.parametrize(("alpn", "http2"), [(["http/1.1"], True), (["h2", "http/1.1"], False)],
                         ids=["endpoint-offers-only-http1", "http2-off"])
def test_http1_where_the_endpoint_or_the_config_says_so(trusted: tuple[str, str], alpn: list[str],
                                                        http2: bool) -> None:
    server = _receiver(trusted, alpn)
    try:
        batch = messages(40, groups=8)
        sink = webhook(server.url, batch_size=2, max_in_flight=8, http2=http2)
        sink.open()
        try:
            assert deliver_in_order(sink, batch) == [None] * 40
        finally:
            sink.close()
        assert {r["version"] for r in server.requests} == {"1.1"}
        assert sorted(server.acked_keys()) == sorted(keys(batch))
    finally:
        server.stop()


def test_a_rejected_message_is_isolated_and_a_late_request_cut_at_its_deadline(trusted: tuple[str, str]) -> None:
    batch = messages(60, groups=6)
    poison, late = 13, 20  # in groups g1 and g2
    by_index = {k: i for i, k in enumerate(keys(batch))}

    def decide(got: list[str]) -> tuple[int, float]:
        i = by_index[got[0]]
        return (400 if i == poison else 200), (5.0 if i == late else 0.0)

    server = _receiver(trusted, ["h2", "http/1.1"], decide=decide)
    try:
        sink = webhook(server.url, batch_size=1, max_in_flight=10, timeout_ms=1000)
        sink.open()
        try:
            results = deliver_in_order(sink, batch)
        finally:
            sink.close()
        assert {r["version"] for r in server.requests} == {"2"}
        assert "HTTP 400" in str(results[poison])
        assert "timeout" in str(results[late])
        for i, (m, r) in enumerate(zip(batch, results, strict=True)):
            if i in (poison, late):
                continue
            behind = (m.group == "g1" and i > poison) or (m.group == "g2" and i > late)
            assert r == (HELD if behind else None), (i, m.group, r)
    finally:
        server.stop()


def test_a_server_that_goes_away_is_reconnected_to(trusted: tuple[str, str]) -> None:
    server = _receiver(trusted, ["h2", "http/1.1"])
    port = server.port
    sink = webhook(server.url, batch_size=5, max_in_flight=4)
    sink.open()
    try:
        first = messages(20, groups=4)
        assert deliver_in_order(sink, first) == [None] * 20
        server.stop()  # GOAWAY, then the connection closes
        server = _receiver(trusted, ["h2", "http/1.1"], port=port)
        second = messages(20, groups=4, start=20)
        assert deliver_in_order(sink, second) == [None] * 20
        assert sorted(server.acked_keys()) == sorted(keys(second))
        assert {r["version"] for r in server.requests} == {"2"}
    finally:
        sink.close()
        server.stop()


def test_the_ca_bundle_fixture_is_what_makes_the_endpoint_trusted(tls: tuple[str, str, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without our CA the handshake fails as an unreachable endpoint: the tests above really ran on TLS."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    server = H2Receiver((tls[0], tls[1]), ["h2", "http/1.1"])
    try:
        sink = webhook(server.url, batch_size=5, max_in_flight=4)
        sink.open()
        try:
            with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
                deliver_in_order(sink, messages(5, groups=1))
        finally:
            sink.close()
        assert server.requests == []
        assert Path(tls[2]).read_text().startswith("-----BEGIN CERTIFICATE-----")
    finally:
        server.stop()


class GoawayAfterFirst:
    """A raw HTTP/2 server (hyper-h2, TLS, ALPN h2) that answers the first stream of each connection and
    then sends GOAWAY naming it as the last: every other stream of that connection was not processed. The
    first connection answers only once `gather` requests have arrived on it (a condition, not a delay: a
    loaded machine sends them as slowly as it likes), so that many are left unprocessed behind the GOAWAY."""

    def __init__(self, tls: tuple[str, str], gather: int = 1) -> None:
        self.processed: list[str] = []  # idempotency keys answered 200
        self.connections = 0
        self.gather = gather
        self.left_behind: list[int] = []  # per connection: requests that arrived past its GOAWAY's last stream
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
        context.set_alpn_protocols(["h2"])
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        box: dict[str, Any] = {}

        async def start() -> None:
            box["server"] = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=context)
            ready.set()

        self._thread = threading.Thread(target=lambda: (self._loop.run_until_complete(start()),
                                                        self._loop.run_forever()), daemon=True)
        self._thread.start()
        ready.wait(10)
        self._server = box["server"]
        self.url = f"https://localhost:{self._server.sockets[0].getsockname()[1]}/hook"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        gather = self.gather if self.connections == 1 else 1
        index = len(self.left_behind)
        self.left_behind.append(0)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        bodies: dict[int, bytes] = {}
        ended: list[int] = []
        first: int | None = None
        deadline = time.monotonic() + 30  # a client that never sends `gather` requests is answered anyway
        try:
            while True:
                try:
                    data = await asyncio.wait_for(reader.read(65536), 1.0)
                except TimeoutError:
                    data = None  # nothing new: look at the deadline
                else:
                    if not data:
                        break
                if first is not None:
                    continue  # after the GOAWAY, as RFC 9113 6.8 says: later frames ignored, until the client closes
                for event in conn.receive_data(data) if data else []:
                    if isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                        bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                    elif isinstance(event, h2.events.StreamEnded):
                        ended.append(event.stream_id)
                if first is None and ended and (len(ended) >= gather or time.monotonic() > deadline):
                    first = ended[0]
                    self.left_behind[index] = len(ended) - 1
                    self.processed += [m["metadata"]["idempotency_key"] for m in json.loads(bodies[first])["data"]]
                    conn.send_headers(first, [(":status", "200")], end_stream=True)
                    conn.close_connection(last_stream_id=first)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def test_requests_the_endpoint_did_not_process_go_again_on_a_new_connection(trusted: tuple[str, str]) -> None:
    server = GoawayAfterFirst(trusted, gather=6)
    try:
        batch = messages(6, groups=6)  # six groups: all six requests go out at once
        sink = webhook(server.url, batch_size=1, max_in_flight=6)
        sink.open()
        try:
            assert deliver_in_order(sink, batch) == [None] * 6
            more = messages(24, groups=24, start=6)  # a connection per request: the ended ones are forgotten
            assert deliver_in_order(sink, more) == [None] * 24
            assert sink._pool is not None and len(sink._pool._retiring) <= 6
        finally:
            sink.close()
        assert sorted(server.processed) == sorted(keys(batch + more)), "each request processed exactly once"
        assert server.left_behind[0] == 5, server.left_behind  # five went again after the first GOAWAY
        assert server.connections >= 2
    finally:
        server.stop()


class Hostile(GoawayAfterFirst):
    """A raw HTTP/2 server with one hostile habit: `refuse` resets every stream of its first connection with
    REFUSED_STREAM (not processed) and answers later connections; `early_413` advertises a 16-byte window,
    never opens it, and answers each request 413 with END_STREAM as soon as its headers arrive; `reset`
    resets its first `gather` requests, once whole, with INTERNAL_ERROR and answers the later ones; `drop`
    closes its first connection, unanswered, once `gather` requests are whole on it, and answers later
    connections."""

    def __init__(self, tls: tuple[str, str], mode: str, gather: int = 1) -> None:
        self.mode = mode
        self.resets = gather if mode == "reset" else 0
        super().__init__(tls, gather)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first_connection = self.connections == 1
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        if self.mode == "early_413":
            conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16})
        writer.write(conn.data_to_send())
        bodies: dict[int, bytes] = {}
        whole = 0  # requests received whole on this connection
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        if self.mode == "refuse" and first_connection:
                            conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                        elif self.mode == "early_413":
                            conn.send_headers(event.stream_id, [(":status", "413")], end_stream=True)
                    elif isinstance(event, h2.events.DataReceived) and self.mode != "early_413":
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                        if self.mode != "refuse" or not first_connection:  # a refused stream's data is dropped
                            bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                    elif isinstance(event, h2.events.StreamEnded) and event.stream_id in bodies:
                        whole += 1
                        if self.mode == "drop" and first_connection:
                            continue
                        if self.resets:
                            self.resets -= 1
                            conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                            continue
                        self.processed += [m["metadata"]["idempotency_key"]
                                           for m in json.loads(bodies.pop(event.stream_id))["data"]]
                        conn.send_headers(event.stream_id, [(":status", "200")], end_stream=True)
                if self.mode == "drop" and first_connection and whole >= self.gather:
                    break  # the connection lost with every request on it unanswered
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            writer.close()


def test_refused_streams_go_again_on_a_new_connection(trusted: tuple[str, str]) -> None:
    server = Hostile(trusted, "refuse")
    try:
        batch = messages(6, groups=6)
        sink = webhook(server.url, batch_size=1, max_in_flight=6)
        sink.open()
        try:
            assert deliver_in_order(sink, batch) == [None] * 6  # not one reported unanswered
        finally:
            sink.close()
        assert sorted(server.processed) == sorted(keys(batch))
        assert server.connections >= 2
    finally:
        server.stop()


def test_an_early_413_is_returned_at_once_while_the_body_waits_on_flow_control(trusted: tuple[str, str]) -> None:
    server = Hostile(trusted, "early_413")
    try:
        batch = messages(1, groups=1)
        body = json.loads(batch[0].payload)
        body["record"]["pad"] = "x" * 300_000  # past the connection's 64 KiB window, which is never opened
        batch[0].payload = json.dumps(body).encode()
        sink = webhook(server.url, batch_size=1, timeout_ms=20_000)
        sink.open()
        try:
            began = time.monotonic()
            results = deliver_in_order(sink, batch)
            took = time.monotonic() - began
        finally:
            sink.close()
        assert results[0] is not None and "413" in results[0]
        assert took < 10, f"waited {took:.1f} s of the 20 s deadline for a 413 already received"
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["reset", "drop"])
def test_another_reset_or_a_lost_connection_fails_its_requests_as_unanswered_at_once(
        trusted: tuple[str, str], mode: str) -> None:
    """RST_STREAM INTERNAL_ERROR after the whole request, or the connection closed under six whole requests:
    the endpoint may have processed them, so they are not sent again at once; each is reported unanswered
    right away (not at its deadline) and sent again by the engine's next call, which the sink makes on a
    new connection when the old one is gone."""
    server = Hostile(trusted, mode, gather=6)
    try:
        batch = messages(6, groups=6)
        sink = webhook(server.url, batch_size=1, max_in_flight=6, timeout_ms=20_000)
        sink.open()
        try:
            began = time.monotonic()
            results = deliver_in_order(sink, batch)
            took = time.monotonic() - began
            assert server.processed == []
            why = "INTERNAL_ERROR" if mode == "reset" else "connection ended"
            assert all(r is not None and r is not HELD and why in r for r in results), results
            assert took < 10, f"waited {took:.1f} s of the 20 s deadline for requests already failed"
            assert deliver_in_order(sink, batch) == [None] * 6  # what the engine does with unanswered ones
        finally:
            sink.close()
        assert sorted(server.processed) == sorted(keys(batch))
        assert server.connections == (1 if mode == "reset" else 2)
    finally:
        server.stop()
