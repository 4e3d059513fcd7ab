"""Test-only encoders producing pgoutput protocol v1 bytes, the inverse of ``pgoutput.decode``.

Written independently from the decoder (plain ``struct.pack`` per field, straight from the documented
layouts) so that round-trip tests check the decoder against the spec rather than against itself.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta

from cdc_pipeline.postgres.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    Truncate,
    TupleData,
    TypeMsg,
    Update,
)

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def ts_to_pg(value: datetime) -> int:
    return (value - PG_EPOCH) // timedelta(microseconds=1)


def cstring(value: str) -> bytes:
    return value.encode() + b"\x00"


def tuple_data(values: TupleData, binary: bool = False) -> bytes:
    out = [struct.pack("!H", len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(value, bytes):
            out.append(b"b" if binary else b"t")
            out.append(struct.pack("!I", len(value)))
            out.append(value)
        else:
            raise TypeError(f"cannot encode tuple value {value!r}")
    return b"".join(out)


def encode(msg: Message) -> bytes:
    """Encode any decoded message back to its wire form."""
    if isinstance(msg, Begin):
        return b"B" + struct.pack("!QqI", msg.final_lsn, ts_to_pg(msg.commit_ts), msg.xid)
    if isinstance(msg, Commit):
        return b"C" + struct.pack("!BQQq", msg.flags, msg.commit_lsn, msg.end_lsn, ts_to_pg(msg.commit_ts))
    if isinstance(msg, Origin):
        return b"O" + struct.pack("!Q", msg.origin_lsn) + cstring(msg.name)
    if isinstance(msg, Relation):
        parts = [
            b"R",
            struct.pack("!I", msg.relation_id),
            cstring(msg.namespace),
            cstring(msg.name),
            msg.replica_identity.encode("latin-1"),  # one byte, any value
            struct.pack("!H", len(msg.columns)),
        ]
        for col in msg.columns:
            parts += [
                struct.pack("!B", col.flags),
                cstring(col.name),
                struct.pack("!Ii", col.type_oid, col.type_modifier),
            ]
        return b"".join(parts)
    if isinstance(msg, TypeMsg):
        return b"Y" + struct.pack("!I", msg.type_oid) + cstring(msg.namespace) + cstring(msg.name)
    if isinstance(msg, Insert):
        return b"I" + struct.pack("!I", msg.relation_id) + b"N" + tuple_data(msg.new)
    if isinstance(msg, Update):
        old = b""
        if msg.old_kind is not None:
            assert msg.old is not None
            old = msg.old_kind.encode("ascii") + tuple_data(msg.old)
        return b"U" + struct.pack("!I", msg.relation_id) + old + b"N" + tuple_data(msg.new)
    if isinstance(msg, Delete):
        return b"D" + struct.pack("!I", msg.relation_id) + msg.old_kind.encode("ascii") + tuple_data(msg.old)
    if isinstance(msg, Truncate):
        return (
            b"T"
            + struct.pack("!IB", len(msg.relation_ids), msg.options)
            + b"".join(struct.pack("!I", rel) for rel in msg.relation_ids)
        )
    if isinstance(msg, LogicalMessage):
        return (
            b"M"
            + struct.pack("!BQ", 1 if msg.transactional else 0, msg.lsn)
            + cstring(msg.prefix)
            + struct.pack("!I", len(msg.content))
            + msg.content
        )
    raise TypeError(f"not a pgoutput message: {msg!r}")
