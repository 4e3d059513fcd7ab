"""A lean HTTP client on asyncio streams, for the webhook's window of requests (issue 23): HTTP/1.1 here,
HTTP/2 (sinks/http2.py) with an https endpoint whose TLS handshake picks `h2` from the offered protocols.

httpx's connection pool costs milliseconds of CPU per request once ~100 are outstanding (measured:
~120 requests/s at 100 in flight against an endpoint answering in 20 ms, where a plain asyncio client
does ~3,500 on the same 2 cores), so the webhook speaks HTTP/1.1 itself: keep-alive connections, one
request at a time each, TCP_NODELAY (asyncio sets it on TCP sockets), TLS through `ssl`. Only what a
webhook needs: POST a body, read the status and at most `max_body` bytes of the answer (Content-Length,
chunked, or until close), all within one deadline. No proxies, no redirects (a 3xx is the caller's).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections import deque
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from cdc_pipeline.sinks.http_guard import ConnectFailed, DeadlineExceeded, TransportFailed

if TYPE_CHECKING:  # imported where HTTP/2 is offered (https): hyper-h2 costs a plain-http webhook ~10 ms of start
    from cdc_pipeline.sinks.http2 import Http2Connection

MAX_HEAD = 64 * 1024  # bytes of status line + headers accepted from an endpoint


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class HttpPool:
    """Keep-alive HTTP/1.1 connections to one URL's origin, as many as requests run at once (the caller
    bounds it); or, where the endpoint picks it (`http2`, https only), one HTTP/2 connection for them all."""

    def __init__(self, url: str, keep: int, http2: bool = True) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme.lower() == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        default = parts.port is None or parts.port == (443 if self.https else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if default else f"{host}:{self.port}"
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.basic: str | None = None  # user info in the URL: Basic auth, as httpx did
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.basic = "Basic " + base64.b64encode(pair).decode()
        self._ssl = _context(["http/1.1"]) if self.https else None
        self._idle: deque[_Conn] = deque()
        self._keep = keep
        # HTTP/2: offered in the first handshake (and again after a connection ends); None once the
        # endpoint chose HTTP/1.1.
        self._offer_h2 = _context(["h2", "http/1.1"]) if self.https and http2 else None
        self._h2: Http2Connection | None = None
        self._retiring: set[Http2Connection] = set()
        self._choosing = asyncio.Lock()

    async def post(self, headers: dict[str, str], body: bytes, deadline_s: float,
                   max_body: int) -> tuple[int, bytes]:
        """(status, at most `max_body` bytes of the body) within `deadline_s` for the whole exchange."""
        loop = asyncio.get_running_loop()
        until = loop.time() + deadline_s
        if self._offer_h2 is not None:
            from cdc_pipeline.sinks.http2 import StreamRefused

            if self.basic is not None and not any(k.lower() == "authorization" for k in headers):
                headers = {**headers, "Authorization": self.basic}
            while (h2 := await self._http2(until)) is not None:  # None: the endpoint chose HTTP/1.1
                try:
                    return await h2.post(headers, body, max(0.0, until - loop.time()), max_body)
                except StreamRefused:  # not processed by the endpoint: again on a new connection, in time
                    if loop.time() >= until:
                        raise DeadlineExceeded() from None
        head = self._head(headers, len(body))
        for reused in (True, False):
            conn = self._take() if reused else None
            if conn is None:
                reused = False
                conn = await self._connect(until, self._ssl)
            try:
                async with asyncio.timeout_at(until):
                    conn.writer.write(head + body)
                    status, data, keep = await _response(conn.reader, max_body)
            except TimeoutError:
                conn.close()
                raise DeadlineExceeded() from None
            except (_Stale, ConnectionError) as exc:
                conn.close()
                if reused:
                    continue  # the endpoint closed an idle connection: once more on a fresh one
                raise TransportFailed("RemoteProtocolError: the endpoint closed the connection without "
                                      f"answering ({type(exc).__name__})") from None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                conn.close()
                raise TransportFailed(f"{type(exc).__name__}: {exc}") from exc
            except BaseException:  # cancelled mid-exchange: the connection is in an unknown state
                conn.close()
                raise
            if keep and len(self._idle) < self._keep:
                self._idle.append(conn)
            else:
                conn.close()
            return status, data
        raise AssertionError("unreachable")

    async def _connect(self, until: float, context: ssl.SSLContext | None) -> _Conn:
        try:
            async with asyncio.timeout_at(until):
                return _Conn(*await asyncio.open_connection(
                    self.host, self.port, ssl=context, limit=MAX_HEAD,
                    server_hostname=self.host if context else None))
        except TimeoutError:
            raise ConnectFailed("ConnectTimeout: no connection within the timeout") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc

    async def _http2(self, until: float) -> Http2Connection | None:
        """The endpoint's HTTP/2 connection, opened if need be; None when it chose HTTP/1.1 (the connection
        of that handshake is kept for HTTP/1.1, and HTTP/2 is not offered again)."""
        async with self._choosing:  # one handshake decides; the requests of the window wait for it
            if self._h2 is not None and self._h2.usable:
                return self._h2
            if self._offer_h2 is None:
                return None
            self._retiring = {c for c in self._retiring if not c.finished}
            if self._h2 is not None:  # ending: it closes itself after its last answer
                self._retiring.add(self._h2)
                self._h2 = None
            conn = await self._connect(until, self._offer_h2)
            tls = conn.writer.get_extra_info("ssl_object")
            if tls is not None and tls.selected_alpn_protocol() == "h2":
                from cdc_pipeline.sinks.http2 import Http2Connection

                self._h2 = Http2Connection(conn.reader, conn.writer, self.authority, self.target)
                return self._h2
            self._offer_h2 = None
            self._idle.append(conn)
            return None

    def _take(self) -> _Conn | None:
        """An idle connection the endpoint has not closed meanwhile."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.close()
        return None

    def _head(self, headers: dict[str, str], length: int) -> bytes:
        lines = [f"POST {self.target} HTTP/1.1", f"Host: {self.authority}", f"Content-Length: {length}"]
        if self.basic is not None and not any(k.lower() == "authorization" for k in headers):
            lines.append(f"Authorization: {self.basic}")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()
        for h2 in [*self._retiring, *([self._h2] if self._h2 is not None else [])]:
            await h2.aclose()
        self._h2, self._retiring = None, set()


def _context(protocols: list[str]) -> ssl.SSLContext:
    """The system's trust, offering `protocols` by ALPN."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(protocols)
    return context


class _Stale(Exception):
    """The connection ended before any byte of a response."""


async def _response(reader: asyncio.StreamReader, max_body: int) -> tuple[int, bytes, bool]:
    """Status, body (capped), and whether the connection can be reused."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Stale() from None
            raise
        lines = head[:-4].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError("not an HTTP/1.x response")
        status = int(rest[:3])
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            continue  # 100 Continue and friends: the answer follows
        keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
        if "chunked" in fields.get("transfer-encoding", "").lower():
            data, complete = await _chunked(reader, max_body)
            return status, data, keep and complete
        if "content-length" in fields:
            length = int(fields["content-length"])
            if length > max_body:  # the rest is never read: the connection is dropped instead
                return status, await reader.readexactly(max_body), False
            return status, await reader.readexactly(length), keep
        if status in (204, 304):
            return status, b"", keep
        data = bytearray()  # delimited by the end of the connection
        while len(data) < max_body and (part := await reader.read(max_body - len(data))):
            data += part
        return status, bytes(data), False


async def _chunked(reader: asyncio.StreamReader, max_body: int) -> tuple[bytes, bool]:
    data = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return bytes(data), True
        if len(data) + size > max_body:
            data += await reader.readexactly(max_body - len(data))
            return bytes(data), False
        data += await reader.readexactly(size)
        await reader.readexactly(2)
