"""Webhook sink: POST `{"data": [message, ...]}`, a request per call; any 2xx acknowledges the request.

* The body is the already-encoded payloads joined with commas: never re-parsed or re-serialised.
* `hmac_secret_env` names an environment variable; its value signs the exact body bytes
  (HMAC-SHA256, lower-case hex) in `signature_header`, and `<timestamp>.<body>` in
  `<signature_header>-V2`, with the Unix time in `X-CDC-Timestamp` (so a receiver can refuse replays).
* A rejected request (non-2xx) of more than one message is bisected, halves sent left then right, until
  the rejected message is isolated, so one poison message does not fail its neighbours. A request stops
  at its first failure and its results end there (the scheduler hands back those of the rest whose group is
  still in order), so nothing of a group is sent past its failed message.
* Statuses that speak for the whole endpoint (3xx, 401, 403, 407, 429, 502, 503, 504) are not bisected
  and say the endpoint is down: the scheduler sends nothing more (requests already out finish); with nothing
  acknowledged the batch is retried later, else the rest of it fails. Connection refused / DNS failure / connect timeout are handled the same way.
* A timeout (`timeout_ms`: a total deadline for the whole request, and for each connect, write and read)
  fails the request's messages without bisecting: a slow endpoint would only get slower. At most a few KB
  of a response body is read (sinks/http_guard.py).
* The scheduler (delivery/schedule/requests.py) has up to the sink's `max_in_flight` requests of its
  `batch_size` messages out at once on the sink's event loop, a group's next request only after its previous
  one was acknowledged. A lean HTTP/1.1 client (sinks/http1.py) keeps a keep-alive connection per request
  out, TCP_NODELAY; no thread per request. With an https endpoint that offers HTTP/2 (TLS ALPN; `http2: false` turns it off), the whole
  window goes over one connection as concurrent streams (sinks/http2.py).
* Every request carries an `Idempotency-Key` header: the message's key, or `first..last` for a request
  of several messages (each message's own key is in its metadata).
* `route` is ignored: a webhook sink has one URL.
* Errors and logs never contain header values (nor their words, e.g. a bearer token), the secret, or the
  URL's password, path segments or query values, even in echoed bodies; control characters are escaped.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Mapping, Sequence

from cdc_pipeline.core.metrics_registry import REQUEST_SECONDS, REQUESTS_IN_FLIGHT
from cdc_pipeline.sinks.base import (
    EventLoopThread,
    Limits,
    OutboundMessage,
    SinkConfigError,
    SinkConfigLike,
    Unreachable,
    safe_endpoint,
)
from cdc_pipeline.sinks.http1 import HttpPool
from cdc_pipeline.sinks.http_guard import (
    MAX_ERROR_BODY,
    ConnectFailed,
    DeadlineExceeded,
    TransportFailed,
    mask,
    secrets_of,
    timestamped_signature,
)
from cdc_pipeline.sinks.request_sink import RequestSink, Sent

# The sink's declared limits (sinks/base.py Limits); `sinks[].batch_size` / `max_in_flight` override them.
BATCH_SIZE = 1000  # messages per request by default
MAX_IN_FLIGHT = 100  # requests outstanding at once by default: 5,000 requests/s at 20 ms each

KEEP_ALIVE = 10_000  # idle connections kept, at most: as many as requests were out at once (the scheduler's)
# The whole endpoint answers for these; bisecting would multiply requests without isolating anything.
ENDPOINT_STATUSES = frozenset({401, 403, 407, 429, 502, 503, 504})


class _EndpointDown(Exception):
    """The endpoint as a whole refuses or cannot be reached."""


class _ChunkFailed(Exception):
    """This request failed as a whole (timeout, broken connection, non-bisectable status)."""

    def __init__(self, reason: str, bisect: bool) -> None:
        super().__init__(reason)
        # No answer (timeout, broken connection) says nothing about the message itself.
        self.reason = reason if bisect else Unreachable(reason)
        self.bisect = bisect


class WebhookSink(RequestSink):
    def __init__(self, sink_config: SinkConfigLike, environ: Mapping[str, str] = os.environ) -> None:
        dest = sink_config.destination
        self.name = sink_config.name
        self.url: str = dest.url
        self.extra_headers: dict[str, str] = dict(dest.headers or {})
        self.timeout_ms: int = dest.timeout_ms
        self.secret_env: str | None = dest.hmac_secret_env
        self.signature_header: str = dest.signature_header
        self.http2: bool = dest.http2
        self._where = safe_endpoint(self.url)  # for messages
        self._environ = environ
        self._secret: bytes | None = None
        self._masked: list[str] = []  # values that must never appear in an error
        self._runner: EventLoopThread | None = None
        self._pool: HttpPool | None = None
        self._in_flight = REQUESTS_IN_FLIGHT.labels(self.name)
        self._request_seconds = REQUEST_SECONDS.labels(self.name)

    # -- lifecycle --------------------------------------------------------------------------------
    def open(self) -> None:
        if self.secret_env:
            value = self._environ.get(self.secret_env)
            if not value:
                state = "is not set" if value is None else "is empty"
                raise SinkConfigError(f"webhook sink {self.name!r}: environment variable {self.secret_env} "
                                      f"(hmac_secret_env) {state}")
            self._secret = value.encode()
        self._masked = secrets_of(self.url, self.extra_headers.values(),
                                  [self._secret.decode()] if self._secret else [])
        if self._runner is None:
            self._runner = EventLoopThread(f"webhook-sink-{self.name}")
        self._pool = HttpPool(self.url, KEEP_ALIVE, self.http2)

    def close(self) -> None:
        runner, pool, self._runner, self._pool = self._runner, self._pool, None, None
        if runner is None:
            return
        try:
            if pool is not None:
                runner.run(pool.aclose(), timeout=30)
        finally:
            runner.stop()

    # -- delivery ---------------------------------------------------------------------------------
    def limits(self) -> Limits:
        return Limits(batch_size=BATCH_SIZE, max_in_flight=MAX_IN_FLIGHT)

    def loop(self) -> EventLoopThread:
        if self._pool is None:
            self.open()
        assert self._runner is not None
        return self._runner

    async def send(self, batch: Sequence[OutboundMessage]) -> Sent:
        results: list[str | None] = []  # in order, up to the first failure: what follows is not attempted
        try:
            await self._attempt(batch, results)
        except _EndpointDown as exc:
            return Sent([*results, *[Unreachable(f"not sent: {exc}")] * (len(batch) - len(results))], str(exc))
        return Sent(results)

    async def _attempt(self, batch: Sequence[OutboundMessage], results: list[str | None]) -> bool:
        """POST these messages, bisecting a rejection down to its message, their results added to `results`;
        True if one failed (nothing after it is sent)."""
        try:
            await self._post([m.payload for m in batch], [m.key for m in batch])
        except _ChunkFailed as exc:
            if exc.bisect and len(batch) > 1:
                mid = len(batch) // 2  # left first: keeps group order
                return await self._attempt(batch[:mid], results) or await self._attempt(batch[mid:], results)
            results += [exc.reason] * len(batch)
            return True
        results += [None] * len(batch)
        return False

    async def _post(self, payloads: list[bytes], keys: list[str]) -> None:
        assert self._pool is not None
        body = b'{"data":[' + b",".join(payloads) + b"]}"
        # The key travels in the body too, but a transform may drop it: the header always carries it
        # (a request of several messages names its first and last: `first..last`).
        idempotency = keys[0] if len(keys) == 1 else f"{keys[0]}..{keys[-1]}"
        # identity: an error body is read raw and capped (http_guard), never decompressed
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", "Idempotency-Key": idempotency,
                   **self.extra_headers}
        if self._secret is not None:
            headers[self.signature_header] = hmac.new(self._secret, body, hashlib.sha256).hexdigest()
            headers.update(timestamped_signature(self._secret, body, self.signature_header))
        where = self._where
        self._in_flight.inc()
        began = time.monotonic()
        try:
            status, text = await self._pool.post(headers, body, self.timeout_ms / 1000, MAX_ERROR_BODY)
        except DeadlineExceeded as exc:
            raise _ChunkFailed(f"timeout: no response from {where} within {self.timeout_ms} ms "
                               "(a total deadline for the request)",
                               bisect=False) from exc
        except ConnectFailed as exc:
            raise _EndpointDown(f"webhook {where} unreachable: {self._mask(str(exc))}") from exc
        except TransportFailed as exc:
            raise _ChunkFailed(f"transport error: {self._mask(str(exc))}", bisect=False) from exc
        finally:
            self._in_flight.dec()
            self._request_seconds.observe(time.monotonic() - began)
        if 200 <= status < 300:
            return
        reason = f"HTTP {status}: {self._mask(text.decode('utf-8', 'replace')[:200])}"
        if status in ENDPOINT_STATUSES or 300 <= status < 400:
            raise _EndpointDown(f"webhook {where} answered {reason}")
        raise _ChunkFailed(reason, bisect=status != 408)

    def _mask(self, text: str) -> str:
        return mask(text, self._masked)
