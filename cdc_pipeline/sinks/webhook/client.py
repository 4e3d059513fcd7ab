"""Webhook sink: POST `{"data": [message, ...]}` in chunks of `batch_size`; any 2xx acknowledges the chunk.

* The body is the already-encoded payloads joined with commas: never re-parsed or re-serialised.
* `hmac_secret_env` names an environment variable; its value signs the exact body bytes
  (HMAC-SHA256, lower-case hex) in `signature_header`, and `<timestamp>.<body>` in
  `<signature_header>-V2`, with the Unix time in `X-CDC-Timestamp` (so a receiver can refuse replays).
* A rejected chunk (non-2xx) of more than one message is bisected, halves sent left then right, until
  the rejected message is isolated, so one poison message does not fail its neighbours. The sink stops
  at the first failure (later messages are reported NOT_SENT: the engine hands back those whose group
  is still in order), so nothing of a group is sent past its failed message.
* Statuses that speak for the whole endpoint (3xx, 401, 403, 407, 429, 502, 503, 504) are not bisected:
  with nothing acknowledged yet they raise SinkUnavailable (retry the batch later), else they fail the
  rest of the batch. Connection refused / DNS failure / connect timeout are handled the same way.
* A timeout (`timeout_ms`: a total deadline for the whole request, and for each connect, write and read)
  fails the chunk's messages without bisecting: a slow endpoint would only get slower. At most a few KB
  of a response body is read (sinks/http_guard.py).
* Chunks with disjoint groups may be in flight together (up to CONCURRENCY), so that concurrency
  never reorders a group; ungrouped messages never conflict. One keep-alive `httpx.Client` serves all of them.
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
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from cdc_pipeline.sinks.base import (
    NOT_SENT,
    OutboundMessage,
    Sink,
    SinkConfigError,
    SinkConfigLike,
    SinkUnavailable,
    Unreachable,
    safe_endpoint,
)
from cdc_pipeline.sinks.http_guard import (
    DeadlineExceeded,
    mask,
    post_bounded,
    secrets_of,
    timestamped_signature,
)

CONCURRENCY = 4
# The whole endpoint answers for these; bisecting would multiply requests without isolating anything.
ENDPOINT_STATUSES = frozenset({401, 403, 407, 429, 502, 503, 504})
_PENDING = "\x00pending"  # placeholder result; never returned (compared by identity)


class _EndpointDown(Exception):
    """The endpoint as a whole refuses or cannot be reached."""


class _ChunkFailed(Exception):
    """This request failed as a whole (timeout, broken connection, non-bisectable status)."""

    def __init__(self, reason: str, bisect: bool) -> None:
        super().__init__(reason)
        # No answer (timeout, broken connection) says nothing about the message itself.
        self.reason = reason if bisect else Unreachable(reason)
        self.bisect = bisect


class WebhookSink(Sink):
    def __init__(self, sink_config: SinkConfigLike, environ: Mapping[str, str] = os.environ) -> None:
        dest = sink_config.destination
        self.name = sink_config.name
        self.url: str = dest.url
        self.extra_headers: dict[str, str] = dict(dest.headers or {})
        self.timeout_ms: int = dest.timeout_ms
        self.secret_env: str | None = dest.hmac_secret_env
        self.signature_header: str = dest.signature_header
        self.batch_size: int = dest.batch_size
        self._environ = environ
        self._secret: bytes | None = None
        self._masked: list[str] = []  # values that must never appear in an error
        self._client: httpx.Client | None = None
        self._pool: ThreadPoolExecutor | None = None

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
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout_ms / 1000),
            limits=httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY),
        )
        self._pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix=f"webhook-{self.name}")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- delivery ---------------------------------------------------------------------------------
    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        if self._client is None:
            self.open()
        assert self._pool is not None
        results: list[str | None] = [_PENDING] * len(batch)
        size = self.batch_size
        chunks = [list(range(i, min(i + size, len(batch)))) for i in range(0, len(batch), size)]
        down: str | None = None
        stopped = False  # a message failed: the rest is left to the engine
        for wave in _waves(batch, chunks):
            if down is not None or stopped:
                for chunk in wave:
                    for i in chunk:
                        results[i] = NOT_SENT if down is None else Unreachable(f"not sent: {down}")
                continue
            if len(wave) == 1:
                outcomes = [self._run_chunk(batch, wave[0], results)]
            else:
                outcomes = list(self._pool.map(lambda c: self._run_chunk(batch, c, results), wave))
            for chunk, (failed, reason) in zip(wave, outcomes, strict=True):
                stopped = stopped or failed
                if reason is None:
                    continue
                down = reason
                for i in chunk:
                    if results[i] is _PENDING:
                        results[i] = Unreachable(f"not sent: {reason}")
            if down is not None and not any(r is None for r in results):
                raise SinkUnavailable(down)
        return results

    def _run_chunk(self, batch: Sequence[OutboundMessage], chunk: list[int],
                   results: list[str | None]) -> tuple[bool, str | None]:
        """Deliver one chunk (bisecting as needed): whether a message failed, and why the endpoint is
        down if it is."""
        try:
            return self._attempt(batch, chunk, results), None
        except _EndpointDown as exc:
            return True, str(exc)

    def _attempt(self, batch: Sequence[OutboundMessage], idx: list[int], results: list[str | None]) -> bool:
        """POST these messages, bisecting a rejection down to its message; True if one failed (the
        messages after it are then NOT_SENT)."""
        try:
            self._post([batch[i].payload for i in idx], [batch[i].key for i in idx])
        except _ChunkFailed as exc:
            if exc.bisect and len(idx) > 1:
                mid = len(idx) // 2
                if self._attempt(batch, idx[:mid], results):  # left first: keeps group order
                    for i in idx[mid:]:
                        results[i] = NOT_SENT
                    return True
                return self._attempt(batch, idx[mid:], results)
            for i in idx:
                results[i] = exc.reason
            return True
        for i in idx:
            results[i] = None
        return False

    def _post(self, payloads: list[bytes], keys: list[str]) -> None:
        assert self._client is not None
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
        where = safe_endpoint(self.url)
        try:
            status, text = post_bounded(self._client, self.url, body, headers, self.timeout_ms / 1000)
        except DeadlineExceeded as exc:
            raise _ChunkFailed(f"timeout: no response from {where} within {self.timeout_ms} ms "
                               "(a total deadline for the request)",
                               bisect=False) from exc
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise _EndpointDown(f"webhook {where} unreachable: {type(exc).__name__}: {self._mask(str(exc))}") from exc
        except httpx.TimeoutException as exc:
            raise _ChunkFailed(f"timeout: no response from {where} within {self.timeout_ms} ms "
                               f"({type(exc).__name__})", bisect=False) from exc
        except httpx.TransportError as exc:
            raise _ChunkFailed(f"transport error: {type(exc).__name__}: {self._mask(str(exc))}",
                               bisect=False) from exc
        if 200 <= status < 300:
            return
        reason = f"HTTP {status}: {self._mask(text.decode('utf-8', 'replace')[:200])}"
        if status in ENDPOINT_STATUSES or 300 <= status < 400:
            raise _EndpointDown(f"webhook {where} answered {reason}")
        raise _ChunkFailed(reason, bisect=status != 408)

    def _mask(self, text: str) -> str:
        return mask(text, self._masked)


def _waves(batch: Sequence[OutboundMessage], chunks: list[list[int]]) -> list[list[list[int]]]:
    """Consecutive chunks grouped into waves of up to CONCURRENCY whose groups are pairwise disjoint,
    so chunks of one wave can be in flight together without reordering any group."""
    waves: list[list[list[int]]] = []
    seen: set[str] = set()
    for chunk in chunks:
        groups = {g for i in chunk if (g := batch[i].group) is not None}
        if waves and len(waves[-1]) < CONCURRENCY and seen.isdisjoint(groups):
            waves[-1].append(chunk)
            seen |= groups
        else:
            waves.append([chunk])
            seen = groups
    return waves
