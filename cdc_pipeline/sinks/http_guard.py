"""Hostile-endpoint guards for the webhook sink: a total deadline per request and a bounded read of the
response body (both enforced by sinks/http1.py: an endpoint sending a byte every half second is cut at
the deadline, not held per read), and masking of secrets and control characters in anything an
endpoint echoes back.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import unicodedata
from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, urlsplit

MAX_ERROR_BODY = 4096  # bytes of a response body ever read: enough for an error message
MIN_SECRET = 6  # shorter URL parts and header words are too common to be worth masking


class DeadlineExceeded(Exception):
    """The request as a whole took longer than its deadline."""


class ConnectFailed(Exception):
    """No connection to the endpoint (refused, DNS, TLS, connect timeout): the endpoint as a whole is down."""


class TransportFailed(Exception):
    """The connection broke, or the endpoint did not speak HTTP properly: the request has no answer."""


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
