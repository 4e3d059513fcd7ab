"""The streaming replication protocol over psycopg 3's low-level connection.

`START_REPLICATION` puts the connection in COPY BOTH mode; from there we read CopyData frames
(XLogData 'w', primary keepalive 'k') and write standby status updates ('r'). See PostgreSQL's
"Streaming Replication Protocol" chapter for the frame layouts.
"""

from __future__ import annotations

import contextlib
import select
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import pq, sql

from cdc_pipeline.postgres import session

# Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
PG_EPOCH_OFFSET_US = 946_684_800_000_000

_XLOG_HEADER = struct.Struct(">cQQQ")
_KEEPALIVE = struct.Struct(">cQQB")
_STATUS = struct.Struct(">cQQQQB")


class ReplicationError(RuntimeError):
    """The server refused or ended the stream; ``sqlstate`` is the server's error code when it sent one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _error(pgconn: pq.abc.PGconn, result: pq.abc.PGresult | None, what: str) -> ReplicationError:
    sqlstate = None
    message = ""
    if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
        code = result.error_field(pq.DiagnosticField.SQLSTATE)
        sqlstate = code.decode() if code else None
        message = (result.error_message or b"").decode(errors="replace").strip()
    message = message or pgconn.error_message.decode(errors="replace").strip()
    return ReplicationError(f"{what}: {message or 'server closed the connection'}", sqlstate)


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def _now_pg_us() -> int:
    return int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US


@dataclass(slots=True)
class XLogData:
    data_start: int
    wal_end: int
    payload: memoryview


@dataclass(slots=True)
class Keepalive:
    wal_end: int
    reply_requested: bool


class ReplicationStream:
    """One logical replication session on a slot, driven by the caller's loop.

    Safe to share with one other thread that only calls :meth:`send_status` (the status keeper): every
    use of the libpq connection is under one lock.
    """

    def __init__(self, dsn: str, slot: str, publication: str, start_lsn: int = 0) -> None:
        # Keepalives and a connect timeout, but no statement timeout: the stream is one endless COPY.
        self.conn = session.connect(dsn, replication="database", autocommit=True,
                                    application_name="cdc_pipeline.drain")
        self.pgconn = self.conn.pgconn
        self.flushed = start_lsn  # the last position reported as flushed: what the change log holds
        self.last_sent = time.monotonic()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.keeper_error: BaseException | None = None
        # PostgreSQL 18 decodes on when the publication is gone (earlier versions end the stream): pgoutput
        # only warns, at the first change after the drop, and sends nothing more. The warning comes before
        # any later frame, so the stream ends right there, as it does on 17 and before.
        self._missing_publication: str | None = None
        self.conn.add_notice_handler(self._notice)
        # pgoutput splits publication_names as a list of identifiers: a name with capitals must be
        # double-quoted inside the literal, as CREATE PUBLICATION "AccPub" made it.
        names = sql.Identifier(publication).as_string(self.conn)
        self._quoted_name = f'"{publication}"'
        options = sql.SQL("proto_version '1', publication_names {}, messages 'true'").format(sql.Literal(names))
        command = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(slot), sql.SQL(int_to_lsn(start_lsn)), options
        )
        self.pgconn.send_query(command.as_bytes(self.conn))
        result = self.pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            error = _error(self.pgconn, result, "START_REPLICATION failed")
            self.conn.close()
            raise error
        self.pgconn.nonblocking = 1
        self._socket = self.pgconn.socket
        self._held: bytes | memoryview | None = None  # a frame read ahead by waiting()

    def frames(self, timeout: float) -> Iterator[XLogData | Keepalive]:
        """Yield the frames that arrive within `timeout` seconds (fewer if none arrive)."""
        deadline = time.monotonic() + timeout
        pgconn = self.pgconn
        lock = self._lock
        while True:
            if self._missing_publication is not None:
                raise ReplicationError(self._missing_publication, "42704")
            if self._held is not None:  # read by waiting()
                nbytes, data, self._held = 1, self._held, None
            else:
                with lock:
                    nbytes, data = pgconn.get_copy_data(1)
            if nbytes > 0:
                kind = data[0]
                if kind == 0x77:  # 'w'
                    _, start, end, _ = _XLOG_HEADER.unpack_from(data)
                    yield XLogData(start, end, data[_XLOG_HEADER.size:])
                elif kind == 0x6B:  # 'k'
                    _, end, _, reply = _KEEPALIVE.unpack_from(data)
                    yield Keepalive(end, bool(reply))
                continue
            if nbytes == 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                readable, _, _ = select.select([self._socket], [], [], remaining)
                if readable:
                    with lock:
                        pgconn.consume_input()  # OperationalError when the connection is gone
                continue
            # -1: the server ended COPY; -2: error. The error itself is in the next result.
            with lock:
                result = pgconn.get_result()
            raise _error(pgconn, result, "replication stream ended")

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        # 18's WARNING 'skipped loading publication "p"' (55000), told by its code and the quoted name: the
        # server's messages may be translated.
        text = diag.message_primary or ""
        if diag.sqlstate == "55000" and diag.severity_nonlocalized == "WARNING" and self._quoted_name in text:
            self._missing_publication = f"publication {self._quoted_name} does not exist (server: {text})"

    def waiting(self) -> bool:
        """Whether a frame can be read now (received, or on the socket), without waiting for one: False
        means the server has sent everything it had, so a batch held for more may as well be committed."""
        if self._held is not None:
            return True
        with self._lock:
            nbytes, data = self.pgconn.get_copy_data(1)
            if nbytes == 0 and select.select([self._socket], [], [], 0)[0]:
                self.pgconn.consume_input()  # OperationalError when the connection is gone
                nbytes, data = self.pgconn.get_copy_data(1)
        if nbytes > 0:
            self._held = data  # frames() yields it first
        return nbytes != 0  # the end of the stream or an error: frames() raises it

    def send_status(self, flush_lsn: int, write_lsn: int | None = None, reply: bool = False) -> None:
        """Report progress. Only `flush_lsn` lets the server recycle WAL: we pass what the log committed."""
        with self._lock:
            self.flushed = max(self.flushed, flush_lsn)
            flush = self.flushed
            write = max(write_lsn or 0, flush)
            buf = _STATUS.pack(b"r", write, flush, flush, _now_pg_us(), 1 if reply else 0)
            if self.pgconn.put_copy_data(buf) != 1:
                raise _error(self.pgconn, None, "could not send a standby status update")
            deadline = time.monotonic() + 10
            while self.pgconn.flush() == 1:
                if time.monotonic() > deadline:
                    raise ReplicationError("could not send a standby status update: the connection is stuck")
                select.select([], [self._socket], [], 1.0)
            self.last_sent = time.monotonic()

    def keep_alive(self, interval: float) -> threading.Thread:
        """Start the status keeper: a thread that reports the last flushed position whenever nothing was
        sent for `interval` seconds, so the server never times the stream out while the caller is busy
        (reconciling a large page, a slow state commit). It reports nothing new: never ahead of the log."""

        def keep() -> None:
            while not self._closed.wait(min(interval / 2, 1.0)):
                if time.monotonic() - self.last_sent < interval:
                    continue
                try:
                    self.send_status(self.flushed)
                except BaseException as exc:  # the caller's loop sees the broken stream itself
                    self.keeper_error = exc
                    return

        thread = threading.Thread(target=keep, name="drain-status-keeper", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._closed.set()
        # Closing a broken connection must not mask the real error.
        with contextlib.suppress(Exception), self._lock:
            self.conn.close()


def status_interval(source: psycopg.Connection, configured: float) -> float:
    """How often the keeper reports: the configured interval, or a quarter of wal_sender_timeout if less."""
    row = source.execute("SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'").fetchone()
    timeout_s = int(row[0]) / 1000 if row else 0
    return max(0.05, min(configured, timeout_s / 4) if timeout_s > 0 else configured)
