"""HTTP/2 for the webhook where the endpoint offers it (TLS ALPN `h2`): the whole window of requests on one
connection as concurrent streams, on hyper-h2's protocol state machine over an asyncio stream.

Behind TLS, an endpoint that speaks HTTP/2 takes `max_in_flight` requests on one connection: one handshake
instead of one per connection. The contract is the HTTP/1.1 pool's (sinks/http1.py): POST a body; the status
and at most `max_body` bytes of the answer within one deadline; ConnectFailed, TransportFailed or
DeadlineExceeded otherwise.

* The endpoint's SETTINGS_MAX_CONCURRENT_STREAMS bounds the streams open at once: a request beyond it waits
  for a stream, within its deadline.
* Flow control: a body goes out as the endpoint's windows allow; what comes back is acknowledged at once
  (at most `max_body` bytes of it are kept).
* A GOAWAY, or a stream reset with REFUSED_STREAM, stops new streams on the connection: the requests it did
  not take (StreamRefused: past its last stream, or REFUSED_STREAM) are sent again on a new connection by the pool, those it took are answered
  on the old one, which closes after the last. A broken connection or another reset fails the requests it
  carried with TransportFailed: no answer, so the engine sends them again.
* A request past its deadline is reset (CANCEL), so the endpoint stops working on it.
* An answer that comes before the whole body went out (a 413 with END_STREAM while the body waits for the
  endpoint's window) is returned at once; the rest of the body is not sent (RST_STREAM NO_ERROR).
"""

from __future__ import annotations

import asyncio
import contextlib

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from cdc_pipeline.sinks.http_guard import DeadlineExceeded, TransportFailed

READ_SIZE = 64 * 1024


class StreamRefused(TransportFailed):
    """The endpoint did not process this request (a GOAWAY before its stream, REFUSED_STREAM, or the connection
    was already ending): safe to send again on a new connection (RFC 9113, 8.7)."""


def _code(value: int) -> str:
    try:
        return h2.errors.ErrorCodes(value).name
    except ValueError:
        return f"error {value}"


# HTTP/1.1's connection-level headers have no place in HTTP/2 (RFC 9113, 8.2.2); Host is `:authority`.
_NOT_IN_H2 = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host",
                        "te", "content-length"})


def _fields(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """Request headers as HTTP/2 wants them: lower-case names, no connection-level ones."""
    return [(k.lower().encode("latin-1"), v.strip().encode("latin-1")) for k, v in headers.items()
            if k.lower() not in _NOT_IN_H2]


class _Stream:
    __slots__ = ("answer", "status", "data", "max_body")

    def __init__(self, answer: asyncio.Future[tuple[int, bytes]], max_body: int) -> None:
        self.answer = answer
        self.status = 0
        self.data = bytearray()
        self.max_body = max_body


class Http2Connection:
    """One HTTP/2 connection (already negotiated by TLS ALPN) carrying many requests at once."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, authority: str,
                 path: str) -> None:
        self._reader, self._writer = reader, writer
        self._base = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", authority.encode("latin-1")),
                      (b":path", path.encode("latin-1"))]
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self._h2.initiate_connection()
        self._streams: dict[int, _Stream] = {}
        self._changed = asyncio.Condition()  # a stream ended, a window or a setting changed, or the end
        self._closed: str | None = None  # why no new stream may start here
        self._flush()
        self._reading = asyncio.ensure_future(self._read())

    @property
    def usable(self) -> bool:
        return self._closed is None

    @property
    def finished(self) -> bool:
        """Closed, with nothing left to read: the pool may forget it."""
        return self._reading.done()

    async def post(self, headers: dict[str, str], body: bytes, deadline_s: float,
                   max_body: int) -> tuple[int, bytes]:
        """(status, at most `max_body` bytes of the body) within `deadline_s` for the whole exchange."""
        loop = asyncio.get_running_loop()
        until = loop.time() + deadline_s
        stream_id: int | None = None
        try:
            async with asyncio.timeout_at(until):
                await self._wait_for(lambda: self._closed is not None or self._h2.open_outbound_streams
                                     < self._h2.remote_settings.max_concurrent_streams)
                self._check_open()
                stream_id = self._h2.get_next_available_stream_id()
                answer: asyncio.Future[tuple[int, bytes]] = loop.create_future()
                self._streams[stream_id] = _Stream(answer, max_body)
                fields = [*self._base, (b"content-length", str(len(body)).encode()), *_fields(headers)]
                self._h2.send_headers(stream_id, fields, end_stream=not body)
                self._flush()
                await self._send_body(stream_id, body, answer)
                return await answer
        except TimeoutError:
            self._cancel(stream_id)
            raise DeadlineExceeded() from None
        except h2.exceptions.ProtocolError as exc:
            self._cancel(stream_id)
            raise TransportFailed(f"HTTP/2 protocol error: {type(exc).__name__}") from exc
        except BaseException:
            self._cancel(stream_id)
            raise
        finally:
            if stream_id is not None:
                self._streams.pop(stream_id, None)
            self._retire_if_done()

    async def aclose(self) -> None:
        if self._closed is None:
            with contextlib.suppress(Exception):
                self._h2.close_connection()
                self._flush()
        self._end("closed by the client")
        self._reading.cancel()
        with contextlib.suppress(BaseException):
            await self._reading

    def _retire_if_done(self) -> None:
        """A connection that takes no new streams (GOAWAY, replaced) closes once its last request ended."""
        if self._closed is not None and not self._streams:
            with contextlib.suppress(Exception):
                self._h2.close_connection()
                self._flush()
            self._end(self._closed)
            self._reading.cancel()

    # -- sending ----------------------------------------------------------------------------------
    async def _send_body(self, stream_id: int, body: bytes, answer: asyncio.Future[tuple[int, bytes]]) -> None:
        view, sent = memoryview(body), 0
        while sent < len(body):
            if answer.done():  # answered (an early 413 with END_STREAM) or reset before the body went out
                with contextlib.suppress(h2.exceptions.H2Error):
                    self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)  # the rest is not needed
                    self._flush()
                return
            self._check_open()
            size = min(self._h2.local_flow_control_window(stream_id), self._h2.max_outbound_frame_size,
                       len(body) - sent)
            if size <= 0:  # the endpoint's window is full: wait for it to open, or for its answer
                await self._wait_for(lambda: self._closed is not None or answer.done() or
                                     self._h2.local_flow_control_window(stream_id) > 0)
                continue
            self._h2.send_data(stream_id, bytes(view[sent:sent + size]), end_stream=sent + size == len(body))
            sent += size
            self._flush()

    def _cancel(self, stream_id: int | None) -> None:
        """Reset a stream this side gives up on (deadline, cancellation), if it is still open."""
        if stream_id is None or self._closed is not None:
            return
        with contextlib.suppress(h2.exceptions.H2Error):
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            self._flush()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise StreamRefused(f"HTTP/2 connection ended: {self._closed}")

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data:
            self._writer.write(data)

    async def _wait_for(self, ready: object) -> None:
        async with self._changed:
            await self._changed.wait_for(ready)  # type: ignore[arg-type]

    # -- receiving --------------------------------------------------------------------------------
    async def _read(self) -> None:
        try:
            while True:
                data = await self._reader.read(READ_SIZE)
                if not data:
                    raise ConnectionError("the endpoint closed the connection")
                for event in self._h2.receive_data(data):
                    self._on(event)
                self._flush()
                async with self._changed:
                    self._changed.notify_all()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection is over: every request on it ends without an answer
            self._end(f"{type(exc).__name__}: {exc}")
            async with self._changed:
                self._changed.notify_all()

    def _on(self, event: h2.events.Event) -> None:
        stream = self._streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and stream is not None:
            stream.status = int(dict(event.headers).get(b":status", b"0"))
        elif isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:  # read or not, the bytes count against the windows
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if stream is not None:
                stream.data += event.data[:max(0, stream.max_body - len(stream.data))]
        elif isinstance(event, h2.events.StreamEnded) and stream is not None:
            if not stream.answer.done():
                stream.answer.set_result((stream.status, bytes(stream.data)))
        elif isinstance(event, h2.events.StreamReset) and stream is not None:
            if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
                # Not processed (RFC 9113, 8.7): sent again, on a new connection, as after a GOAWAY; this one
                # takes no new streams and closes after its last answer.
                self._closed = self._closed or "the endpoint refused a stream (REFUSED_STREAM)"
                if not stream.answer.done():
                    stream.answer.set_exception(StreamRefused("the endpoint refused the HTTP/2 stream"))
            elif not stream.answer.done():
                stream.answer.set_exception(TransportFailed(
                    f"the endpoint reset the HTTP/2 stream ({_code(event.error_code)})"))
        elif isinstance(event, h2.events.ConnectionTerminated):
            # Streams up to last_stream_id may still be answered; later ones never will be.
            self._closed = f"GOAWAY ({_code(event.error_code)})"
            for sid, s in self._streams.items():
                if (event.last_stream_id is None or sid > event.last_stream_id) and not s.answer.done():
                    s.answer.set_exception(StreamRefused(f"HTTP/2 connection ended: {self._closed}"))

    def _end(self, why: str) -> None:
        self._closed = self._closed or why
        for s in self._streams.values():
            if not s.answer.done():
                s.answer.set_exception(TransportFailed(f"HTTP/2 connection ended: {why}"))
        with contextlib.suppress(Exception):
            self._writer.close()
