"""Pure decoder for pgoutput logical replication messages, protocol version 1.

``decode`` takes the payload of one XLogData message (starting at the message-type byte) and returns
one of the immutable message types below. No I/O happens here.

Byte layouts follow the PostgreSQL 15 documentation, "Logical Replication Message Formats". Integers
are big-endian; strings are NUL-terminated UTF-8. Streaming (protocol v2+) messages are deliberately
rejected as unknown: the pipeline never enables ``streaming``, so seeing one means a misconfiguration.

The message types live in pgoutput_messages.py (re-exported here); the hot paths (Insert/Update/Delete)
bypass even their generated ``__new__`` and call ``tuple.__new__`` directly.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from typing import Final

__all__ = [
    "UNCHANGED_TOAST",
    "Begin",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Origin",
    "PgOutputError",
    "Relation",
    "Truncate",
    "TupleData",
    "TypeMsg",
    "Update",
    "decode",
    "pg_timestamp_to_datetime",
]


from cdc_pipeline.postgres.pgoutput_messages import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    PgOutputError,
    Relation,
    Truncate,
    TupleData,
    TypeMsg,
    Update,
)

# Precompiled layouts; offsets are relative to the start of the message (type byte at 0).
_BEGIN: Final = struct.Struct("!QqI")  # final LSN, commit ts, xid
_COMMIT: Final = struct.Struct("!BQQq")  # flags, commit LSN, end LSN, commit ts
_U8: Final = struct.Struct("!B")
_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_U64: Final = struct.Struct("!Q")
_REL_TAIL: Final = struct.Struct("!BH")  # replica identity, number of columns
_COL_TAIL: Final = struct.Struct("!Ii")  # type oid, type modifier (atttypmod, -1 = none)
_REL_KIND: Final = struct.Struct("!IB")  # relation oid + following submessage byte
_TRUNC_HEAD: Final = struct.Struct("!IB")  # number of relations, option bits
_MSG_HEAD: Final = struct.Struct("!BQ")  # flags, LSN

_unpack_u16 = _U16.unpack_from
_unpack_u32 = _U32.unpack_from
_unpack_rel_kind = _REL_KIND.unpack_from
_tuple_new = tuple.__new__

_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_ONE_US: Final = timedelta(microseconds=1)

_N, _K, _O = ord("N"), ord("K"), ord("O")
_KO: Final = frozenset(b"KO")
_KIND_NULL, _KIND_TOAST = ord("n"), ord("u")
_VALUE_KINDS: Final = frozenset(b"tb")  # text, binary: both carry Int32 length + bytes


def pg_timestamp_to_datetime(us: int) -> datetime:
    """Microseconds since 2000-01-01 00:00 UTC (PostgreSQL's TimestampTz epoch) -> aware datetime."""
    return _PG_EPOCH + _ONE_US * us


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.find(0, pos)
    if end < 0:
        raise PgOutputError(f"unterminated string at offset {pos}")
    return buf[pos:end].decode(), end + 1


def _tuple_data(buf: bytes, pos: int) -> tuple[TupleData, int]:
    """Parse a TupleData at ``pos``; returns the values and the offset just after them.

    Slices past the end are silently short in Python, so callers must check the final offset against
    the buffer length (``_end``); a short read of a kind byte or length raises IndexError/struct.error,
    which ``decode`` converts to PgOutputError.
    """
    (ncols,) = _unpack_u16(buf, pos)
    pos += 2
    values: list[object] = []
    append = values.append
    for _ in range(ncols):
        kind = buf[pos]
        if kind in _VALUE_KINDS:
            start = pos + 5
            pos = start + _unpack_u32(buf, pos + 1)[0]
            append(buf[start:pos])
        elif kind == _KIND_NULL:
            append(None)
            pos += 1
        elif kind == _KIND_TOAST:
            append(UNCHANGED_TOAST)
            pos += 1
        else:
            raise PgOutputError(f"unknown tuple column kind {bytes([kind])!r} at offset {pos}")
    return tuple(values), pos


def _end(buf: bytes, pos: int) -> None:
    if pos != len(buf):
        if pos > len(buf):
            raise PgOutputError(f"truncated message: need {pos} bytes, have {len(buf)}")
        raise PgOutputError(f"{len(buf) - pos} trailing bytes after message of {pos} bytes")


def _decode_insert(buf: bytes) -> Insert:
    relation_id, kind = _unpack_rel_kind(buf, 1)
    if kind != _N:
        raise PgOutputError(f"Insert: expected 'N' tuple, got {bytes([kind])!r}")
    new, pos = _tuple_data(buf, 6)
    _end(buf, pos)
    return _tuple_new(Insert, (relation_id, new))


def _decode_update(buf: bytes) -> Update:
    relation_id, kind = _unpack_rel_kind(buf, 1)
    pos = 6
    if kind == _N:
        old_kind = old = None
    elif kind in _KO:
        old_kind = "K" if kind == _K else "O"
        old, pos = _tuple_data(buf, pos)
        if buf[pos] != _N:
            raise PgOutputError(f"Update: expected 'N' tuple at offset {pos}, got {buf[pos : pos + 1]!r}")
        pos += 1
    else:
        raise PgOutputError(f"Update: expected 'K', 'O' or 'N', got {bytes([kind])!r}")
    new, pos = _tuple_data(buf, pos)
    _end(buf, pos)
    return _tuple_new(Update, (relation_id, old_kind, old, new))


def _decode_delete(buf: bytes) -> Delete:
    relation_id, kind = _unpack_rel_kind(buf, 1)
    if kind == _K:
        old_kind = "K"
    elif kind == _O:
        old_kind = "O"
    else:
        raise PgOutputError(f"Delete: expected 'K' or 'O', got {bytes([kind])!r}")
    old, pos = _tuple_data(buf, 6)
    _end(buf, pos)
    return _tuple_new(Delete, (relation_id, old_kind, old))


def _decode_begin(buf: bytes) -> Begin:
    _end(buf, 1 + _BEGIN.size)
    final_lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
    return Begin(final_lsn, pg_timestamp_to_datetime(ts), xid)


def _decode_commit(buf: bytes) -> Commit:
    _end(buf, 1 + _COMMIT.size)
    flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf, 1)
    return Commit(flags, commit_lsn, end_lsn, pg_timestamp_to_datetime(ts))


def _decode_origin(buf: bytes) -> Origin:
    (origin_lsn,) = _U64.unpack_from(buf, 1)
    name, pos = _cstring(buf, 9)
    _end(buf, pos)
    return Origin(origin_lsn, name)


def _decode_relation(buf: bytes) -> Relation:
    (relation_id,) = _unpack_u32(buf, 1)
    namespace, pos = _cstring(buf, 5)
    name, pos = _cstring(buf, pos)
    ident, ncols = _REL_TAIL.unpack_from(buf, pos)
    pos += _REL_TAIL.size
    columns = []
    for _ in range(ncols):
        (flags,) = _U8.unpack_from(buf, pos)
        col_name, pos = _cstring(buf, pos + 1)
        type_oid, type_modifier = _COL_TAIL.unpack_from(buf, pos)
        pos += _COL_TAIL.size
        columns.append(Column(flags, col_name, type_oid, type_modifier))
    _end(buf, pos)
    return Relation(relation_id, namespace, name, chr(ident), tuple(columns))


def _decode_type(buf: bytes) -> TypeMsg:
    (type_oid,) = _unpack_u32(buf, 1)
    namespace, pos = _cstring(buf, 5)
    name, pos = _cstring(buf, pos)
    _end(buf, pos)
    return TypeMsg(type_oid, namespace, name)


def _decode_truncate(buf: bytes) -> Truncate:
    nrels, options = _TRUNC_HEAD.unpack_from(buf, 1)
    pos = 1 + _TRUNC_HEAD.size
    _end(buf, pos + 4 * nrels)  # checked before unpacking so a huge bogus count fails fast
    relation_ids = struct.unpack_from(f"!{nrels}I", buf, pos)
    return Truncate(options, relation_ids)


def _decode_message(buf: bytes) -> LogicalMessage:
    flags, lsn = _MSG_HEAD.unpack_from(buf, 1)
    # The prefix is the application's input: in a SQL_ASCII database it need not be UTF-8. Undecodable bytes
    # become lone surrogates, so it never equals one of the pipeline's (ASCII) prefixes and never fails here.
    start = 1 + _MSG_HEAD.size
    end = buf.find(0, start)
    if end < 0:
        raise PgOutputError(f"unterminated string at offset {start}")
    prefix, pos = buf[start:end].decode("utf-8", "surrogateescape"), end + 1
    (length,) = _unpack_u32(buf, pos)
    pos += 4
    _end(buf, pos + length)
    return LogicalMessage(bool(flags & 1), lsn, prefix, buf[pos:])


_DECODERS: Final = {
    ord("I"): _decode_insert,
    ord("U"): _decode_update,
    ord("D"): _decode_delete,
    ord("B"): _decode_begin,
    ord("C"): _decode_commit,
    ord("O"): _decode_origin,
    ord("R"): _decode_relation,
    ord("Y"): _decode_type,
    ord("T"): _decode_truncate,
    ord("M"): _decode_message,
}


def decode(buf: bytes | bytearray | memoryview) -> Message:
    """Decode exactly one pgoutput message; raise PgOutputError if it is unknown, short or too long."""
    if type(buf) is not bytes:
        # One copy up front: slicing bytes yields bytes, which is what TupleData promises.
        buf = bytes(buf)
    if not buf:
        raise PgOutputError("empty message")
    decoder = _DECODERS.get(buf[0])
    if decoder is None:
        raise PgOutputError(f"unknown pgoutput message type {buf[:1]!r} (0x{buf[0]:02x})")
    try:
        return decoder(buf)
    except PgOutputError:
        raise
    except (struct.error, IndexError, ValueError, OverflowError) as exc:
        # struct.error/IndexError: short buffer; ValueError: bad UTF-8; OverflowError: absurd timestamp.
        raise PgOutputError(f"malformed {buf[:1]!r} message ({len(buf)} bytes): {exc}") from exc
