"""Hostile-endpoint guards for the webhook sink: a total deadline per request, a bounded read of the
response body, and masking of secrets and control characters in anything an endpoint echoes back.

httpx's timeouts apply to each connect/read/write, so an endpoint sending a byte every half second holds
a request forever; here a timer shuts the request's socket down at the deadline, which wakes the blocked
read (closing a socket does not; shutting it down does). The socket is found through httpcore's trace
hook (a new connection) or the response's network stream (a reused one, once headers are in).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import socket
import threading
import time
import unicodedata
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx

MAX_ERROR_BODY = 4096  # bytes of a response body ever read: enough for an error message
MIN_SECRET = 6  # shorter URL parts and header words are too common to be worth masking


class DeadlineExceeded(Exception):
    """The request as a whole took longer than its deadline."""


def post_bounded(client: httpx.Client, url: str, body: bytes, headers: dict[str, str], deadline_s: float,
                 max_body: int = MAX_ERROR_BODY) -> tuple[int, bytes]:
    """POST and return (status, at most ``max_body`` bytes of the body); raise DeadlineExceeded if the whole
    exchange (connect, send, headers, body) is not done in ``deadline_s``. httpx errors pass through."""
    sockets: list[socket.socket] = []
    fired = threading.Event()
    lock = threading.Lock()

    def shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def on_deadline() -> None:
        with lock:
            fired.set()
            for sock in sockets:
                shut(sock)

    def track(sock: Any) -> None:
        if isinstance(sock, socket.socket):
            with lock:
                sockets.append(sock)
                if fired.is_set():
                    shut(sock)

    def trace(event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            if stream is not None:
                track(stream.get_extra_info("socket"))

    timer = threading.Timer(deadline_s, on_deadline)
    timer.daemon = True
    started = time.monotonic()
    timer.start()
    try:
        with client.stream("POST", url, content=body, headers=headers, extensions={"trace": trace}) as response:
            stream = response.extensions.get("network_stream")
            if stream is not None:
                track(stream.get_extra_info("socket"))
            data = bytearray()
            for chunk in response.iter_raw():
                data += chunk
                if len(data) >= max_body or time.monotonic() - started > deadline_s:
                    break  # the rest is never read: leaving the block closes the connection
            if fired.is_set():
                raise DeadlineExceeded()
            return response.status_code, bytes(data[:max_body])
    except httpx.TransportError:
        if fired.is_set():
            raise DeadlineExceeded() from None
        raise
    finally:
        timer.cancel()


TIMESTAMP_HEADER = "X-CDC-Timestamp"


def timestamped_signature(secret: bytes, body: bytes, signature_header: str,
                          now: float | None = None) -> dict[str, str]:
    """Headers that let a receiver refuse a replayed request: the send time, and an HMAC-SHA256 (lower-case
    hex) of ``<timestamp>.<body>`` in ``<signature_header>-V2``. The body-only signature stays as it was."""
    timestamp = str(int(time.time() if now is None else now))
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: timestamp, f"{signature_header}-V2": mac}


def secrets_of(url: str, header_values: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """Strings to mask in echoed text: header values and their words (a bearer token alone), the URL's
    password, path segments and query values (a secret path or query token), raw and percent-decoded."""
    found: set[str] = set()
    for value in [*header_values, *extra]:
        found.add(value)
        found.update(value.split())
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return sorted((s for s in found if len(s) >= MIN_SECRET), key=len, reverse=True)
    if password:
        found.update((password, unquote(password)))
    for segment in parts.path.split("/"):
        found.update((segment, unquote(segment)))
    for _key, value in parse_qsl(parts.query, keep_blank_values=True):
        found.update((value, unquote(value)))
    if parts.query:
        found.add(parts.query)
    return sorted((s for s in found if len(s) >= MIN_SECRET), key=len, reverse=True)


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``***`` and control characters escaped (so an echoed body
    cannot forge log lines or terminal escapes)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return escape_controls(text)


def escape_controls(text: str) -> str:
    return "".join(c if unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp") else repr(c)[1:-1] for c in text)
