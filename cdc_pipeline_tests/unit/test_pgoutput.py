"""Unit tests for the pgoutput decoder: hand-built wire bytes, hypothesis round trips, malformed input."""

from __future__ import annotations

import contextlib
import copy
import pickle
import struct
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_pipeline.postgres.pgoutput import (
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
    TypeMsg,
    Update,
    decode,
)
from cdc_pipeline_tests.unit.pgoutput_builders import PG_EPOCH, encode, tuple_data

# No example database: these tests must not write into the source tree.
hyp = settings(database=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ----------------------------------------------------------------------------------

u8 = st.integers(0, 2**8 - 1)
u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
lsns = st.integers(0, 2**64 - 1)
# Protocol strings are NUL-terminated UTF-8: anything but NUL and lone surrogates.
names = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40)
# Whole range of datetime, microsecond precision, as PostgreSQL's int64 TimestampTz can carry.
timestamps = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999), timezones=st.just(UTC)
)
values = st.one_of(st.none(), st.just(UNCHANGED_TOAST), st.binary(max_size=64))
tuples = st.lists(values, max_size=24).map(tuple)

begins = st.builds(Begin, lsns, timestamps, u32)
commits = st.builds(Commit, u8, lsns, lsns, timestamps)
origins = st.builds(Origin, lsns, names)
columns = st.builds(Column, u8, names, u32, i32)
relations = st.builds(
    Relation,
    u32,
    names,
    names,
    st.sampled_from("dnfi"),
    st.lists(columns, max_size=12).map(tuple),
)
type_msgs = st.builds(TypeMsg, u32, names, names)
inserts = st.builds(Insert, u32, tuples)
updates = st.one_of(
    st.builds(Update, u32, st.none(), st.none(), tuples),
    st.builds(lambda r, k, o, n: Update(r, k, o, n), u32, st.sampled_from("KO"), tuples, tuples),
)
deletes = st.builds(Delete, u32, st.sampled_from("KO"), tuples)
truncates = st.builds(Truncate, u8, st.lists(u32, max_size=20).map(tuple))
logical_messages = st.builds(LogicalMessage, st.booleans(), lsns, names, st.binary(max_size=200))

messages = st.one_of(
    begins,
    commits,
    origins,
    relations,
    type_msgs,
    inserts,
    updates,
    deletes,
    truncates,
    logical_messages,
)


def assert_same(decoded: Message, expected: Message) -> None:
    # NamedTuples compare as plain tuples, so check the type too.
    assert type(decoded) is type(expected)
    assert decoded == expected


def tuple_elements_ok(values: object) -> None:
    assert isinstance(values, tuple)
    for value in values:
        assert value is None or value is UNCHANGED_TOAST or type(value) is bytes


# --- hand-built wire bytes (independent of the builders) -----------------------------------------


def test_begin_bytes() -> None:
    buf = b"B" + bytes.fromhex("0000000116B3F2A8") + (1_000_000).to_bytes(8, "big") + (742).to_bytes(4, "big")
    msg = decode(buf)
    assert msg == Begin(0x116B3F2A8, datetime(2000, 1, 1, 0, 0, 1, tzinfo=UTC), 742)
    assert isinstance(msg, Begin)
    assert msg.commit_ts.tzinfo is not None and msg.commit_ts.utcoffset() == timedelta(0)


def test_commit_bytes_negative_timestamp_and_max_lsn() -> None:
    buf = b"C\x00" + b"\xff" * 8 + b"\x00" * 7 + b"\x10" + (-1).to_bytes(8, "big", signed=True)
    msg = decode(buf)
    assert isinstance(msg, Commit)
    assert msg == Commit(0, 2**64 - 1, 16, datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC))


def test_insert_bytes() -> None:
    buf = (
        b"I\x00\x00\x40\x00N\x00\x04"
        + b"t\x00\x00\x00\x0242"
        + b"n"
        + b"t\x00\x00\x00\x00"  # empty string is distinct from NULL
        + b"t\x00\x00\x00\x03\xc3\xa9!"
    )
    msg = decode(buf)
    assert isinstance(msg, Insert)
    assert msg.relation_id == 16384
    assert msg.new == (b"42", None, b"", "é!".encode())
    tuple_elements_ok(msg.new)


def test_update_with_key_and_unchanged_toast() -> None:
    buf = (
        b"U\x00\x00\x40\x01"
        + b"K\x00\x02t\x00\x00\x00\x017n"
        + b"N\x00\x03t\x00\x00\x00\x018ut\x00\x00\x00\x01x"
    )
    msg = decode(buf)
    assert isinstance(msg, Update)
    assert msg == Update(16385, "K", (b"7", None), (b"8", UNCHANGED_TOAST, b"x"))
    assert msg.new[1] is UNCHANGED_TOAST


def test_update_without_old_tuple() -> None:
    msg = decode(b"U\x00\x00\x00\x05N\x00\x01n")
    assert msg == Update(5, None, None, (None,))


def test_delete_full_old_row() -> None:
    msg = decode(b"D\x00\x00\x00\x05O\x00\x02nt\x00\x00\x00\x01z")
    assert isinstance(msg, Delete)
    assert msg == Delete(5, "O", (None, b"z"))


def test_relation_bytes() -> None:
    buf = (
        b"R\x00\x00\x40\x00public\x00orders\x00f\x00\x02"
        + b"\x01id\x00\x00\x00\x00\x14\xff\xff\xff\xff"
        + b"\x00note\x00\x00\x00\x04\x13\x00\x00\x00\x44"
    )
    msg = decode(buf)
    assert isinstance(msg, Relation)
    assert msg == Relation(
        16384, "public", "orders", "f", (Column(1, "id", 20, -1), Column(0, "note", 1043, 68))
    )
    assert [c.is_key for c in msg.columns] == [True, False]


def test_type_origin_truncate_message_bytes() -> None:
    assert decode(b"Y\x00\x00\x30\x39public\x00mood\x00") == TypeMsg(12345, "public", "mood")
    assert decode(b"O" + b"\x00" * 7 + b"\x09" + b"node_a\x00") == Origin(9, "node_a")
    trunc = decode(b"T\x00\x00\x00\x02\x03\x00\x00\x00\x01\x00\x00\x00\x02")
    assert trunc == Truncate(3, (1, 2))
    assert isinstance(trunc, Truncate) and trunc.cascade and trunc.restart_identity
    msg = decode(b"M\x01" + b"\x00" * 7 + b"\x2a" + b"cdc.heartbeat\x00" + b"\x00\x00\x00\x02hi")
    assert msg == LogicalMessage(True, 42, "cdc.heartbeat", b"hi")


def test_a_message_prefix_that_is_not_utf8_decodes_and_is_never_ours() -> None:
    """A SQL_ASCII source lets an application emit any bytes as a prefix: the message still decodes (the
    drain must not stop on it), and its prefix can never equal one of the pipeline's ASCII prefixes."""
    raw = b"cdc_pipeline.probe\xff"
    msg = decode(b"M\x01" + b"\x00" * 7 + b"\x2a" + raw + b"\x00" + b"\x00\x00\x00\x01\xfe")
    assert isinstance(msg, LogicalMessage) and msg.content == b"\xfe"
    assert msg.prefix != "cdc_pipeline.probe" and msg.prefix.encode("utf-8", "surrogateescape") == raw


def test_binary_kind_yields_bytes() -> None:
    msg = decode(b"I\x00\x00\x00\x01N" + tuple_data((b"\x00\x01", None), binary=True))
    assert msg == Insert(1, (b"\x00\x01", None))


def test_empty_tuple_and_wide_tuple() -> None:
    assert decode(b"I\x00\x00\x00\x01N\x00\x00") == Insert(1, ())
    wide = tuple(str(i).encode() if i % 3 else None for i in range(1664))  # MaxTupleAttributeNumber
    assert decode(encode(Insert(7, wide))) == Insert(7, wide)


@pytest.mark.parametrize("options, cascade, restart", [(0, False, False), (1, True, False), (2, False, True)])
def test_truncate_flags(options: int, cascade: bool, restart: bool) -> None:
    msg = Truncate(options, ())
    assert (msg.cascade, msg.restart_identity) == (cascade, restart)


def test_column_is_key() -> None:
    assert Column(1, "a", 23, -1).is_key
    assert not Column(0, "a", 23, -1).is_key
    assert Column(3, "a", 23, -1).is_key


def test_accepts_memoryview_and_bytearray() -> None:
    raw = encode(Update(1, "O", (b"a", None), (b"b", UNCHANGED_TOAST)))
    for buf in (memoryview(raw), bytearray(raw), memoryview(b"xx" + raw)[2:]):
        msg = decode(buf)
        assert msg == Update(1, "O", (b"a", None), (b"b", UNCHANGED_TOAST))
        assert isinstance(msg, Update)
        tuple_elements_ok(msg.new)
        tuple_elements_ok(msg.old)


def test_unchanged_toast_sentinel() -> None:
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
    assert UNCHANGED_TOAST is not None
    assert UNCHANGED_TOAST != None  # noqa: E711 - the point is that it is not equal to None
    assert type(UNCHANGED_TOAST)() is UNCHANGED_TOAST
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert copy.deepcopy((UNCHANGED_TOAST,))[0] is UNCHANGED_TOAST
    assert copy.copy(UNCHANGED_TOAST) is UNCHANGED_TOAST


def test_messages_are_immutable() -> None:
    msg = Insert(1, (b"a",))
    with pytest.raises(AttributeError):
        msg.relation_id = 2  # type: ignore[misc]


# --- malformed input -----------------------------------------------------------------------------


def test_error_is_value_error() -> None:
    assert issubclass(PgOutputError, ValueError)


def test_empty_buffer() -> None:
    with pytest.raises(PgOutputError):
        decode(b"")


@given(st.integers(0, 255).filter(lambda b: b not in b"BCORYIUDTM"), st.binary(max_size=30))
@hyp
def test_unknown_type_byte_is_named(kind: int, rest: bytes) -> None:
    with pytest.raises(PgOutputError) as info:
        decode(bytes([kind]) + rest)
    assert repr(bytes([kind])) in str(info.value)
    assert f"0x{kind:02x}" in str(info.value)


@pytest.mark.parametrize("stream_byte", [b"S", b"E", b"c", b"A", b"P", b"K", b"r"])
def test_protocol_v2_plus_messages_rejected(stream_byte: bytes) -> None:
    with pytest.raises(PgOutputError, match="unknown pgoutput message type"):
        decode(stream_byte + b"\x00" * 30)


@pytest.mark.parametrize(
    "buf, match",
    [
        (b"I\x00\x00\x00\x01K\x00\x00", "expected 'N'"),
        (b"I\x00\x00\x00\x01N\x00\x01x", "unknown tuple column kind"),
        (b"U\x00\x00\x00\x01X\x00\x00", "expected 'K', 'O' or 'N'"),
        (b"U\x00\x00\x00\x01K\x00\x00K\x00\x00", "expected 'N' tuple"),
        (b"D\x00\x00\x00\x01N\x00\x00", "expected 'K' or 'O'"),
        (b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x05abc", "truncated"),
        (b"I\x00\x00\x00\x01N\x00\x01t\xff\xff\xff\xffabc", "truncated"),
        (b"Y\x00\x00\x00\x01public\x00mood", "unterminated string"),
        (b"Y\x00\x00\x00\x01pub\xfflic\x00mood\x00", "malformed"),
        (b"T\xff\xff\xff\xff\x00", "truncated"),
        (b"M\x00" + b"\x00" * 8 + b"p\x00\x00\x00\x00\x09abc", "truncated"),
        (b"B" + b"\x00" * 8 + b"\x7f" + b"\xff" * 7 + b"\x00" * 4, "malformed"),  # beyond datetime range
    ],
)
def test_malformed_messages(buf: bytes, match: str) -> None:
    with pytest.raises(PgOutputError, match=match):
        decode(buf)


@pytest.mark.parametrize(
    "msg",
    [
        Begin(1, PG_EPOCH, 2),
        Commit(0, 1, 2, PG_EPOCH),
        Origin(1, "o"),
        Relation(1, "", "t", "d", ()),
        TypeMsg(1, "", "t"),
        Insert(1, ()),
        Update(1, None, None, ()),
        Delete(1, "K", ()),
        Truncate(0, ()),
        LogicalMessage(False, 1, "", b""),
    ],
)
def test_trailing_bytes_rejected(msg: Message) -> None:
    buf = encode(msg)
    assert_same(decode(buf), msg)
    with pytest.raises(PgOutputError, match="trailing"):
        decode(buf + b"\x00")


# --- hypothesis round trips ----------------------------------------------------------------------


@given(messages)
@hyp
def test_round_trip(msg: Message) -> None:
    decoded = decode(encode(msg))
    assert_same(decoded, msg)
    if isinstance(decoded, Insert | Update):
        tuple_elements_ok(decoded.new)
    if isinstance(decoded, Update | Delete) and decoded.old is not None:
        tuple_elements_ok(decoded.old)


@given(st.one_of(inserts, updates, deletes))
@hyp
def test_round_trip_from_memoryview(msg: Message) -> None:
    assert_same(decode(memoryview(encode(msg))), msg)


@given(messages)
@hyp
def test_every_proper_prefix_is_rejected(msg: Message) -> None:
    buf = encode(msg)
    for cut in range(len(buf)):
        with pytest.raises(PgOutputError):
            decode(buf[:cut])


@given(messages, st.binary(min_size=1, max_size=8))
@hyp
def test_appended_garbage_is_rejected(msg: Message, extra: bytes) -> None:
    with pytest.raises(PgOutputError):
        decode(encode(msg) + extra)


@given(st.sampled_from(b"BCORYIUDTM"), st.binary(max_size=80))
@hyp
def test_garbage_never_leaks_other_exceptions(kind: int, rest: bytes) -> None:
    try:
        msg = decode(bytes([kind]) + rest)
    except PgOutputError:
        return
    # Whatever parses must re-encode to the same bytes: the decoder skipped nothing. (Only a
    # LogicalMessage's flags byte is reduced to a bool.)
    if not isinstance(msg, LogicalMessage):
        assert encode(msg) == bytes([kind]) + rest


@given(messages, st.data())
@hyp
def test_corrupted_lengths_never_leak_other_exceptions(msg: Message, data: st.DataObject) -> None:
    buf = bytearray(encode(msg))
    pos = data.draw(st.integers(0, len(buf) - 1))
    buf[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(PgOutputError):
        decode(buf)


def test_struct_layout_sizes() -> None:
    # Guard against accidental native alignment in the precompiled formats.
    assert len(encode(Begin(0, PG_EPOCH, 0))) == 1 + 8 + 8 + 4
    assert len(encode(Commit(0, 0, 0, PG_EPOCH))) == 1 + 1 + 8 + 8 + 8
    assert struct.calcsize("!QqI") == 20
