"""Unit tests for text-format value conversion and exact JSON serialisation."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_pipeline.postgres import pgjson
from cdc_pipeline.postgres.pgtypes import OID, converter, dumps, parse_array, to_json_value

hyp = settings(database=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])

PG_WS = " \t\n\r\v\f"  # array_isspace() in PostgreSQL


def conv(oid: int, text: str | bytes) -> object:
    return converter(oid)(text.encode() if isinstance(text, str) else text)


# --- test-side renderers (what PostgreSQL's *_out functions print) --------------------------------


def render_element(value: str | None, quote_all: bool = False) -> str:
    """array_out quoting: quote empty, NULL-like, and anything with specials or ASCII whitespace."""
    if value is None:
        return "NULL"
    needs = (
        quote_all
        or value == ""
        or value.encode().lower() == b"null"  # ASCII-only case folding, like pg_strcasecmp
        or any(c in '{}",\\' + PG_WS for c in value)
    )
    if not needs:
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_array(value: object, quote_all: bool = False) -> str:
    if isinstance(value, list):
        return "{" + ",".join(render_array(v, quote_all) for v in value) + "}"
    assert value is None or isinstance(value, str)
    return render_element(value, quote_all)


def pg_offset(seconds: int) -> str:
    sign = "-" if seconds < 0 else "+"
    hh, rest = divmod(abs(seconds), 3600)
    mm, ss = divmod(rest, 60)
    out = f"{sign}{hh:02d}"
    if mm or ss:
        out += f":{mm:02d}"
    if ss:
        out += f":{ss:02d}"
    return out


def pg_timestamp(value: datetime) -> str:
    """timestamp[tz]_out with DateStyle ISO: trailing fraction zeros dropped, short offsets."""
    out = (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    )
    if value.microsecond:
        out += f".{value.microsecond:06d}".rstrip("0")
    offset = value.utcoffset()
    if offset is not None:
        out += pg_offset(int(offset.total_seconds()))
    return out


def reshape(flat: list[object], dims: list[int]) -> list[object]:
    if len(dims) == 1:
        return list(flat)
    step = len(flat) // dims[0]
    return [reshape(flat[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]


@st.composite
def nd_arrays(draw: st.DrawFn, elements: st.SearchStrategy[object]) -> list[object]:
    dims = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    size = math.prod(dims)
    return reshape(draw(st.lists(elements, min_size=size, max_size=size)), dims)


# Valid UTF-8 text (no lone surrogates), including unicode whitespace that PostgreSQL leaves unquoted.
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
tricky_texts = st.one_of(
    texts,
    st.sampled_from(
        ["", "NULL", "null", "NuLl", " x ", 'a"b', "c,d", "{}", "\\", "\\\\", "\u00a0", "a\u2003"]
    ),
)
decimals = st.one_of(
    st.builds(lambda i, s: Decimal(i).scaleb(-s), st.integers(-(10**40), 10**40), st.integers(0, 30)),
    st.sampled_from([Decimal("0"), Decimal("-0"), Decimal("0.000"), Decimal("-0.001"), Decimal("1e-7")]),
)
offsets = st.integers(-(16 * 3600) + 1, 16 * 3600 - 1).map(lambda s: timezone(timedelta(seconds=s)))
naive_datetimes = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)
)


# --- scalars -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "oid, text, expected",
    [
        (OID.INT2, "-32768", -32768),
        (OID.INT2, "32767", 32767),
        (OID.INT4, "-2147483648", -(2**31)),
        (OID.INT4, "0", 0),
        (OID.INT8, "9223372036854775807", 2**63 - 1),
        (OID.INT8, "-9223372036854775808", -(2**63)),
        (OID.OID, "4294967295", 2**32 - 1),
        (OID.BOOL, "t", True),
        (OID.BOOL, "f", False),
        (OID.TEXT, "héllo ☃ 𝄞", "héllo ☃ 𝄞"),
        (OID.TEXT, "", ""),
        (OID.VARCHAR, "x,y", "x,y"),
        (OID.BPCHAR, "ab   ", "ab   "),  # char(n) padding is part of the value
        (OID.NAME, "pg_class", "pg_class"),
        (OID.CHAR, "r", "r"),
        (OID.UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    ],
)
def test_scalar(oid: int, text: str, expected: object) -> None:
    value = conv(oid, text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    "text",
    ["12345678901234567890.123456789", "-0.000001", "0", "1.500", "-99999999999999999999999999999.99", "NaN"],
)
def test_numeric_exact(text: str) -> None:
    value = conv(OID.NUMERIC, text)
    assert isinstance(value, Decimal)
    assert str(value) == text  # digits and scale preserved exactly


@pytest.mark.parametrize("text, sign", [("Infinity", 1), ("-Infinity", -1)])
def test_numeric_infinity(text: str, sign: int) -> None:
    value = conv(OID.NUMERIC, text)
    assert isinstance(value, Decimal) and value.is_infinite() and (value > 0) == (sign > 0)


@pytest.mark.parametrize(
    "oid, text, expected",
    [
        (OID.FLOAT8, "1.5", 1.5),
        (OID.FLOAT8, "-0", -0.0),
        (OID.FLOAT8, "1e+308", 1e308),
        (OID.FLOAT8, "2.2250738585072014e-308", 2.2250738585072014e-308),
        (OID.FLOAT8, "0.1", 0.1),
        (OID.FLOAT4, "1.1754944e-38", 1.1754944e-38),
        (OID.FLOAT4, "Infinity", math.inf),
        (OID.FLOAT8, "-Infinity", -math.inf),
    ],
)
def test_float(oid: int, text: str, expected: float) -> None:
    value = conv(oid, text)
    assert isinstance(value, float) and value == expected
    assert math.copysign(1, value) == math.copysign(1, expected)


def test_float_nan() -> None:
    value = conv(OID.FLOAT8, "NaN")
    assert isinstance(value, float) and math.isnan(value)


@pytest.mark.parametrize(
    "oid, text",
    [
        (OID.INT4, "abc"),
        (OID.INT8, ""),
        (OID.INT2, "1.5"),
        (OID.NUMERIC, "1.2.3"),
        (OID.NUMERIC, ""),
        (OID.FLOAT8, "x"),
        (OID.BOOL, "true"),
        (OID.BOOL, ""),
        (OID.UUID, "not-a-uuid"),
        (OID.JSONB, "{"),
        (OID.BYTEA, "\\xabc"),
        (OID.BYTEA, "\\xzz"),
        (OID.BYTEA, "a\\b"),
        (OID.TEXT, b"\xff"),
    ],
)
def test_malformed_raises_value_error(oid: int, text: str | bytes) -> None:
    with pytest.raises(ValueError):
        conv(oid, text)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2024-02-29", date(2024, 2, 29)),
        ("0001-01-01", date(1, 1, 1)),
        ("9999-12-31", date(9999, 12, 31)),
        ("infinity", "infinity"),
        ("-infinity", "-infinity"),
        ("4713-11-24 BC", "4713-11-24 BC"),
        ("0001-01-01 BC", "0001-01-01 BC"),
        ("10000-01-01", "10000-01-01"),
    ],
)
def test_date(text: str, expected: object) -> None:
    value = conv(OID.DATE, text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2024-01-02 03:04:05", datetime(2024, 1, 2, 3, 4, 5)),
        ("2024-01-02 03:04:05.5", datetime(2024, 1, 2, 3, 4, 5, 500000)),
        ("2024-01-02 03:04:05.000001", datetime(2024, 1, 2, 3, 4, 5, 1)),
        ("2024-01-02 03:04:05.123456", datetime(2024, 1, 2, 3, 4, 5, 123456)),
        ("0001-01-01 00:00:00", datetime(1, 1, 1)),
        ("infinity", "infinity"),
        ("-infinity", "-infinity"),
        ("2000-01-01 00:00:00 BC", "2000-01-01 00:00:00 BC"),
        ("12345-01-01 00:00:00", "12345-01-01 00:00:00"),
    ],
)
def test_timestamp(text: str, expected: object) -> None:
    value = conv(OID.TIMESTAMP, text)
    assert value == expected and type(value) is type(expected)
    if isinstance(value, datetime):
        assert value.tzinfo is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2024-01-02 03:04:05+00", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        (
            "2024-01-02 03:04:05.25+05:30",
            datetime(2024, 1, 2, 3, 4, 5, 250000, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        ),
        ("2024-01-02 03:04:05-03", datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-3)))),
        ("2024-06-01 00:00:00-09:30", datetime(2024, 6, 1, tzinfo=timezone(-timedelta(hours=9, minutes=30)))),
        # Local mean time offsets before time-zone standardisation carry seconds.
        (
            "1850-01-01 00:00:00+00:19:32",
            datetime(1850, 1, 1, tzinfo=timezone(timedelta(minutes=19, seconds=32))),
        ),
    ],
)
def test_timestamptz(text: str, expected: datetime) -> None:
    value = conv(OID.TIMESTAMPTZ, text)
    assert isinstance(value, datetime)
    assert value == expected and value.utcoffset() == expected.utcoffset()


@pytest.mark.parametrize("text", ["infinity", "-infinity", "0044-03-15 12:00:00+00:53:28 BC"])
def test_timestamptz_unrepresentable_stays_str(text: str) -> None:
    assert conv(OID.TIMESTAMPTZ, text) == text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("00:00:00", time(0, 0)),
        ("23:59:59.999999", time(23, 59, 59, 999999)),
        ("12:30:00.5", time(12, 30, 0, 500000)),
        ("24:00:00", "24:00:00"),  # valid in PostgreSQL, not in Python
    ],
)
def test_time(text: str, expected: object) -> None:
    value = conv(OID.TIME, text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("oid", [OID.JSON, OID.JSONB])
@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"a": [1, 2.5, null, true], "b": {"c": "é"}}', {"a": [1, 2.5, None, True], "b": {"c": "é"}}),
        ("[]", []),
        ('"just a string"', "just a string"),
        ("12345678901234567890", 12345678901234567890),
        ("null", None),
    ],
)
def test_json(oid: int, text: str, expected: object) -> None:
    assert conv(oid, text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\x", b""),
        ("\\x00ff10", b"\x00\xff\x10"),
        ("\\xDEADbeef", b"\xde\xad\xbe\xef"),
        # bytea_output = 'escape'
        ("abc", b"abc"),
        ("a\\\\b", b"a\\b"),
        ("\\000\\377x", b"\x00\xffx"),
    ],
)
def test_bytea(text: str, expected: bytes) -> None:
    value = conv(OID.BYTEA, text)
    assert value == expected and type(value) is bytes


@given(st.binary(max_size=100))
@hyp
def test_bytea_hex_round_trip(raw: bytes) -> None:
    assert conv(OID.BYTEA, "\\x" + raw.hex()) == raw


def test_unknown_oid_is_str_and_cached() -> None:
    conv_fn = converter(987654)
    assert conv_fn(b"(1,2)") == "(1,2)"
    assert converter(987654) is conv_fn
    assert converter(OID.INT4) is converter(23)


def test_oid_values() -> None:
    assert (OID.INT2_ARRAY, OID.INT4_ARRAY, OID.INT8_ARRAY, OID.TEXT_ARRAY) == (1005, 1007, 1016, 1009)
    assert (OID.VARCHAR_ARRAY, OID.NUMERIC_ARRAY, OID.FLOAT4_ARRAY, OID.FLOAT8_ARRAY) == (
        1015,
        1231,
        1021,
        1022,
    )
    assert (OID.BOOL_ARRAY, OID.UUID_ARRAY, OID.DATE_ARRAY, OID.TIMESTAMP_ARRAY) == (1000, 2951, 1182, 1115)
    assert (OID.TIMESTAMPTZ_ARRAY, OID.JSON_ARRAY, OID.JSONB_ARRAY, OID.BYTEA_ARRAY) == (
        1185,
        199,
        3807,
        1001,
    )
    assert (OID.NUMERIC, OID.TIMESTAMPTZ, OID.UUID, OID.JSONB, OID.BPCHAR) == (1700, 1184, 2950, 3802, 1042)


@given(st.integers(-(2**63), 2**63 - 1))
@hyp
def test_int8_round_trip(value: int) -> None:
    assert conv(OID.INT8, str(value)) == value


@given(decimals)
@hyp
def test_numeric_round_trip(value: Decimal) -> None:
    parsed = conv(OID.NUMERIC, format(value, "f"))  # numeric_out never uses exponents
    assert isinstance(parsed, Decimal)
    assert parsed == value and format(parsed, "f") == format(value, "f")


@given(st.floats(allow_nan=False))
@hyp
def test_float8_round_trip(value: float) -> None:
    text = repr(value).replace("inf", "Infinity")  # shortest-exact, like float8out since PG 12
    assert conv(OID.FLOAT8, text) == value


@given(naive_datetimes)
@hyp
def test_timestamp_round_trip(value: datetime) -> None:
    assert conv(OID.TIMESTAMP, pg_timestamp(value)) == value


@given(naive_datetimes, offsets)
@hyp
def test_timestamptz_round_trip(value: datetime, tz: timezone) -> None:
    aware = value.replace(tzinfo=tz)
    parsed = conv(OID.TIMESTAMPTZ, pg_timestamp(aware))
    assert isinstance(parsed, datetime)
    assert parsed == aware and parsed.utcoffset() == aware.utcoffset()


@given(st.uuids())
@hyp
def test_uuid_round_trip(value: UUID) -> None:
    assert conv(OID.UUID, str(value)) == value


# --- arrays --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "oid, text, expected",
    [
        (OID.TEXT_ARRAY, '{"a\\"b","c,d",NULL,"NULL"}', ['a"b', "c,d", None, "NULL"]),
        (OID.TEXT_ARRAY, "{}", []),
        (OID.TEXT_ARRAY, "{a,b}", ["a", "b"]),
        (OID.TEXT_ARRAY, '{"",""}', ["", ""]),
        (
            OID.TEXT_ARRAY,
            '{"back\\\\slash","q\\"uote","{braces}"," padded "}',
            ["back\\slash", 'q"uote', "{braces}", " padded "],
        ),
        (OID.TEXT_ARRAY, "{null,Null,NULL}", [None, None, None]),
        (OID.TEXT_ARRAY, '{"null",\\NULL}', ["null", "NULL"]),  # quoting or escaping makes it text
        (OID.TEXT_ARRAY, "{é,☃,𝄞}", ["é", "☃", "𝄞"]),
        (OID.TEXT_ARRAY, "{a\u00a0,\u2003b}", ["a\u00a0", "\u2003b"]),  # not array whitespace
        (OID.TEXT_ARRAY, '{{a,b},{"c}",NULL}}', [["a", "b"], ["c}", None]]),
        (OID.VARCHAR_ARRAY, "{ x , y z }", ["x", "y z"]),  # input-style whitespace is trimmed
        (OID.INT4_ARRAY, "{1,-2,NULL,3}", [1, -2, None, 3]),
        (OID.INT4_ARRAY, "{{1,2,3},{4,5,6}}", [[1, 2, 3], [4, 5, 6]]),
        (OID.INT4_ARRAY, "{{{1},{2}},{{3},{4}}}", [[[1], [2]], [[3], [4]]]),
        (OID.INT4_ARRAY, "[0:2]={7,8,9}", [7, 8, 9]),
        (OID.INT4_ARRAY, "[1:2][1:1]={{7},{8}}", [[7], [8]]),
        (OID.INT2_ARRAY, "{-32768,32767}", [-32768, 32767]),
        (OID.INT8_ARRAY, "{9223372036854775807,-9223372036854775808}", [2**63 - 1, -(2**63)]),
        (
            OID.NUMERIC_ARRAY,
            "{1.10,NaN,-Infinity,12345678901234567890.123456789}",
            [
                Decimal("1.10"),
                Decimal("NaN"),
                Decimal("-Infinity"),
                Decimal("12345678901234567890.123456789"),
            ],
        ),
        (OID.FLOAT4_ARRAY, "{1.5,-Infinity}", [1.5, -math.inf]),
        (OID.FLOAT8_ARRAY, "{{0.1,2},{3,NULL}}", [[0.1, 2.0], [3.0, None]]),
        (OID.BOOL_ARRAY, "{t,f,NULL}", [True, False, None]),
        (
            OID.UUID_ARRAY,
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            [UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")],
        ),
        (OID.DATE_ARRAY, "{2024-01-02,infinity,NULL}", [date(2024, 1, 2), "infinity", None]),
        (
            OID.TIMESTAMP_ARRAY,
            '{"2024-01-02 03:04:05.5",NULL}',
            [datetime(2024, 1, 2, 3, 4, 5, 500000), None],
        ),
        (
            OID.TIMESTAMPTZ_ARRAY,
            '{"2024-01-02 03:04:05+05:30"}',
            [datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5, minutes=30)))],
        ),
        (OID.JSONB_ARRAY, '{"{\\"a\\": 1}","[1, 2]",NULL}', [{"a": 1}, [1, 2], None]),
        (OID.JSON_ARRAY, '{"\\"s\\"",3}', ["s", 3]),
        (OID.BYTEA_ARRAY, '{"\\\\x0102","\\\\x",NULL}', [b"\x01\x02", b"", None]),
    ],
)
def test_array(oid: int, text: str, expected: list[object]) -> None:
    # repr also pins element types (1 == 1.0 == True would hide a wrong converter) and NaN.
    assert repr(conv(oid, text)) == repr(expected)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "}",
        "{1,2",
        "{1,,2}",
        "{,}",
        "{1,}",
        "{,1}",
        "{{1},2}",
        "{1,{2}}",
        "{1}}",
        "{1} x",
        "{1}{2}",
        "1,2",
        '{"a}',
        '{a"b}',
        '{"a"b}',
        "{{1}{2}}",
        "[1:2]{1,2}",
    ],
)
def test_malformed_array(text: str) -> None:
    with pytest.raises(ValueError):
        conv(OID.TEXT_ARRAY, text)


def test_array_element_errors_propagate() -> None:
    with pytest.raises(ValueError):
        conv(OID.INT4_ARRAY, "{1,x}")
    with pytest.raises(ValueError):
        conv(OID.BOOL_ARRAY, '{"yes"}')


@given(nd_arrays(st.one_of(st.none(), tricky_texts)), st.booleans())
@hyp
def test_text_array_round_trip(value: list[object], quote_all: bool) -> None:
    assert conv(OID.TEXT_ARRAY, render_array(value, quote_all)) == value


@given(st.lists(st.one_of(st.none(), tricky_texts), max_size=8))
@hyp
def test_text_array_1d_round_trip(value: list[str | None]) -> None:
    assert parse_array(render_array(value)) == value


@given(nd_arrays(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))))
@hyp
def test_int8_array_round_trip(value: list[object]) -> None:
    def render(v: object) -> str:
        if isinstance(v, list):
            return "{" + ",".join(render(x) for x in v) + "}"
        return "NULL" if v is None else str(v)

    assert conv(OID.INT8_ARRAY, render(value)) == value


@given(st.lists(st.one_of(st.none(), decimals), max_size=10))
@hyp
def test_numeric_array_round_trip(value: list[Decimal | None]) -> None:
    text = "{" + ",".join("NULL" if v is None else format(v, "f") for v in value) + "}"
    parsed = conv(OID.NUMERIC_ARRAY, text)
    assert parsed == value
    assert [None if v is None else format(v, "f") for v in parsed] == [
        None if v is None else format(v, "f") for v in value
    ]


@given(st.lists(st.one_of(st.none(), st.tuples(naive_datetimes, offsets)), max_size=6))
@hyp
def test_timestamptz_array_round_trip(items: list[tuple[datetime, timezone] | None]) -> None:
    value = [None if i is None else i[0].replace(tzinfo=i[1]) for i in items]
    text = render_array([None if v is None else pg_timestamp(v) for v in value])
    assert conv(OID.TIMESTAMPTZ_ARRAY, text) == value


@given(st.lists(st.one_of(st.none(), st.binary(max_size=10)), max_size=6))
@hyp
def test_bytea_array_round_trip(value: list[bytes | None]) -> None:
    text = render_array([None if v is None else "\\x" + v.hex() for v in value])
    assert conv(OID.BYTEA_ARRAY, text) == value


# --- dumps / to_json_value -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (Decimal("12345678901234567890.123456789"), "12345678901234567890.123456789"),
        (Decimal("-0.000000000000000000000000001"), "-0.000000000000000000000000001"),
        (Decimal("1.500"), "1.500"),
        (Decimal("1E-7"), "0.0000001"),
        (Decimal("5E+3"), "5000"),
        (Decimal("-0"), "-0"),
        (Decimal("NaN"), '"NaN"'),
        (Decimal("sNaN"), '"NaN"'),
        (Decimal("Infinity"), '"Infinity"'),
        (Decimal("-Infinity"), '"-Infinity"'),
        (math.nan, '"NaN"'),
        (math.inf, '"Infinity"'),
        (-math.inf, '"-Infinity"'),
        (0.1, "0.1"),
        (datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC), '"2024-01-02T03:04:05.123456+00:00"'),
        (datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-3))), '"2024-01-02T03:04:05-03:00"'),
        (datetime(2024, 1, 2, 3, 4, 5), '"2024-01-02T03:04:05"'),
        (date(2024, 1, 2), '"2024-01-02"'),
        (time(3, 4, 5, 600000), '"03:04:05.600000"'),
        (UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), '"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"'),
        (b"\x00\xff", '"\\\\x00ff"'),
        (b"", '"\\\\x"'),
        ("é☃", '"é☃"'),
        (None, "null"),
        (True, "true"),
        (2**70, str(2**70)),
    ],
)
def test_dumps_values(value: object, expected: str) -> None:
    assert dumps({"v": value}) == '{"v":' + expected + "}"
    assert dumps([value]) == "[" + expected + "]"


def test_dumps_nested_and_mixed() -> None:
    obj = {
        "id": 7,
        "amounts": [Decimal("1.10"), None, [Decimal("-2"), math.nan]],
        "at": datetime(2024, 1, 2, tzinfo=UTC),
        "tags": ("a", "b"),
        "doc": {"k": b"\x01", "f": 1.5, "inf": -math.inf},
    }
    out = dumps(obj)
    assert out == (
        '{"id":7,"amounts":[1.10,null,[-2,"NaN"]],"at":"2024-01-02T00:00:00+00:00",'
        '"tags":["a","b"],"doc":{"k":"\\\\x01","f":1.5,"inf":"-Infinity"}}'
    )
    assert json.loads(out)["doc"]["k"] == "\\x01"


def test_dumps_strings_resembling_markers_untouched() -> None:
    tricky = ["@dec", '"@dec@"', "@", "", "\\x00"]
    assert json.loads(dumps(tricky)) == tricky
    assert json.loads(dumps([Decimal("1"), *tricky])) == [1, *tricky]


def test_dumps_rejects_unknown_types() -> None:
    with pytest.raises(TypeError):
        dumps({"x": object()})
    with pytest.raises(TypeError):
        dumps({"x": {1, 2}})


@given(decimals)
@hyp
def test_dumps_decimal_exact(value: Decimal) -> None:
    out = dumps({"v": value})
    assert out == '{"v":' + format(value, "f") + "}"
    parsed = json.loads(out, parse_float=Decimal, parse_int=Decimal)["v"]
    assert parsed == value


json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    decimals,
    st.sampled_from([Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")]),
    texts,
    st.binary(max_size=8),
    st.uuids(),
    st.datetimes(timezones=st.just(UTC)),
    naive_datetimes,
    st.dates(),
    st.times(),
)
json_trees = st.recursive(
    json_leaves,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)),
    max_leaves=15,
)


def expected_json(value: object) -> object:
    """Reference model of dumps(): what json.loads(dumps(v), parse_float=Decimal) must give back."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float | Decimal):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return Decimal(repr(value)) if isinstance(value, float) else value
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, list):
        return [expected_json(v) for v in value]
    if isinstance(value, dict):
        return {k: expected_json(v) for k, v in value.items()}
    raise AssertionError(value)


@given(json_trees)
@hyp
def test_dumps_matches_reference_model(value: object) -> None:
    out = dumps(value)
    assert json.loads(out, parse_float=Decimal) == expected_json(value)
    assert dumps(to_json_value(value)) == out


@given(json_trees)
@hyp
def test_fast_encoder_matches_stdlib_encoder(value: object) -> None:
    # dumps() reuses one C-level encoder; it must agree with the documented JSONEncoder fallback.
    try:
        expected = pgjson._ENCODER.encode(value)
    except ValueError:  # non-finite floats: both paths must reject them so dumps() can sanitise
        with pytest.raises(ValueError):
            pgjson._encode(value)
        return
    assert pgjson._encode(value) == expected


def test_to_json_value() -> None:
    value = {
        "d": Decimal("1.25"),
        "nan": Decimal("NaN"),
        "f": math.inf,
        "ts": datetime(2024, 1, 2, tzinfo=UTC),
        "b": b"\x01",
        "u": UUID(int=1),
        "l": (1, "x", None, date(2024, 1, 2)),
    }
    assert to_json_value(value) == {
        "d": Decimal("1.25"),  # kept exact; dumps() writes it as a number
        "nan": "NaN",
        "f": "Infinity",
        "ts": "2024-01-02T00:00:00+00:00",
        "b": "\\x01",
        "u": "00000000-0000-0000-0000-000000000001",
        "l": [1, "x", None, "2024-01-02"],
    }


# --- converters feed dumps end to end ------------------------------------------------------------

ROW: list[tuple[int, bytes]] = [
    (OID.INT8, b"9223372036854775807"),
    (OID.NUMERIC, b"12345678901234567890.123456789"),
    (OID.TIMESTAMPTZ, b"2024-01-02 03:04:05.5+05:30"),
    (OID.BYTEA, b"\\x0aff"),
    (OID.TEXT_ARRAY, b'{"a\\"b",NULL}'),
    (OID.JSONB, b'{"k": [1, null]}'),
]


def test_converted_row_to_json() -> None:
    convs: list[Callable[[bytes], object]] = [converter(oid) for oid, _ in ROW]
    row = [c(raw) for c, (_, raw) in zip(convs, ROW, strict=True)]
    assert dumps(row) == (
        '[9223372036854775807,12345678901234567890.123456789,"2024-01-02T03:04:05.500000+05:30",'
        '"\\\\x0aff",["a\\"b",null],{"k":[1,null]}]'
    )
