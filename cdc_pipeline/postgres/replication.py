"""The streaming replication protocol over psycopg 3's low-level connection.

`START_REPLICATION` puts the connection in COPY BOTH mode; from there we read CopyData frames
(XLogData 'w', primary keepalive 'k') and write standby status updates ('r'). See PostgreSQL's
"Streaming Replication Protocol" chapter for the frame layouts.
"""

from __future__ import annotations

import contextlib
import select
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import pq, sql

# Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
PG_EPOCH_OFFSET_US = 946_684_800_000_000

_XLOG_HEADER = struct.Struct(">cQQQ")
_KEEPALIVE = struct.Struct(">cQQB")
_STATUS = struct.Struct(">cQQQQB")


class ReplicationError(RuntimeError):
    pass


def lsn_to_int(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


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
    """One logical replication session on a slot, driven by the caller's loop."""

    def __init__(self, dsn: str, slot: str, publication: str, start_lsn: int = 0) -> None:
        self.conn = psycopg.connect(dsn, replication="database", autocommit=True)
        self.pgconn = self.conn.pgconn
        options = sql.SQL("proto_version '1', publication_names {}, messages 'true'").format(
            sql.Literal(publication)
        )
        command = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(slot), sql.SQL(int_to_lsn(start_lsn)), options
        )
        self.pgconn.send_query(command.as_bytes(self.conn))
        result = self.pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            message = self.pgconn.error_message.decode(errors="replace").strip()
            self.conn.close()
            raise ReplicationError(f"START_REPLICATION failed: {message}")
        self.pgconn.nonblocking = 1
        self._socket = self.pgconn.socket

    def frames(self, timeout: float) -> Iterator[XLogData | Keepalive]:
        """Yield the frames that arrive within `timeout` seconds (fewer if none arrive)."""
        deadline = time.monotonic() + timeout
        pgconn = self.pgconn
        while True:
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
                    pgconn.consume_input()
                continue
            # -1: the server ended COPY; -2: error
            message = pgconn.error_message.decode(errors="replace").strip()
            raise ReplicationError(f"replication stream ended: {message or 'server closed the copy'}")

    def send_status(self, flush_lsn: int, write_lsn: int | None = None, reply: bool = False) -> None:
        """Report progress. Only `flush_lsn` lets the server recycle WAL: we pass what the log committed."""
        write = max(write_lsn or 0, flush_lsn)
        buf = _STATUS.pack(b"r", write, flush_lsn, flush_lsn, _now_pg_us(), 1 if reply else 0)
        if self.pgconn.put_copy_data(buf) != 1:
            raise ReplicationError("could not send standby status update")
        while self.pgconn.flush() == 1:
            select.select([], [self._socket], [], 1.0)

    def close(self) -> None:
        # Closing a broken connection must not mask the real error.
        with contextlib.suppress(Exception):
            self.conn.close()
