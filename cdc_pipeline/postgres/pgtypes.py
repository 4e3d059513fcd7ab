"""Conversion of pgoutput text-format column values to Python, and exact JSON serialisation.

``converter(oid)`` returns a callable turning the raw bytes of a text-format value (PostgreSQL output
format, DateStyle ISO) into a Python value. Converters raise ValueError on malformed input, except the
date/time family: values Python cannot represent (``infinity``, BC dates, years > 9999, ``24:00:00``)
come back as the original ``str`` rather than failing a whole change.

``dumps(obj)`` (pgjson.py) serialises dicts/lists of converted values to compact JSON, keeping
``Decimal`` exact. No I/O happens here.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from enum import IntEnum
from itertools import product
from typing import Final, TypeAlias
from uuid import UUID

__all__ = ["OID", "Converter", "converter", "dumps", "parse_array", "to_json_value"]

Converter: TypeAlias = Callable[[bytes], object]


class OID(IntEnum):
    """pg_type OIDs of the built-in types given dedicated converters."""

    BOOL = 16
    BYTEA = 17
    CHAR = 18
    NAME = 19
    INT8 = 20
    INT2 = 21
    INT4 = 23
    TEXT = 25
    OID = 26
    JSON = 114
    FLOAT4 = 700
    FLOAT8 = 701
    BPCHAR = 1042
    VARCHAR = 1043
    DATE = 1082
    TIME = 1083
    TIMESTAMP = 1114
    TIMESTAMPTZ = 1184
    NUMERIC = 1700
    UUID = 2950
    JSONB = 3802
    # Array types ("_int4" etc.).
    JSON_ARRAY = 199
    BOOL_ARRAY = 1000
    BYTEA_ARRAY = 1001
    CHAR_ARRAY = 1002
    NAME_ARRAY = 1003
    INT2_ARRAY = 1005
    INT4_ARRAY = 1007
    TEXT_ARRAY = 1009
    BPCHAR_ARRAY = 1014
    VARCHAR_ARRAY = 1015
    INT8_ARRAY = 1016
    FLOAT4_ARRAY = 1021
    FLOAT8_ARRAY = 1022
    OID_ARRAY = 1028
    TIMESTAMP_ARRAY = 1115
    DATE_ARRAY = 1182
    TIME_ARRAY = 1183
    TIMESTAMPTZ_ARRAY = 1185
    NUMERIC_ARRAY = 1231
    UUID_ARRAY = 2951
    JSONB_ARRAY = 3807


# --- scalar parsers working on str (array elements arrive as str) -------------------------------


def _numeric(s: str) -> Decimal:
    try:
        return Decimal(s)  # also takes 'NaN', 'Infinity', '-Infinity' as PostgreSQL prints them
    except InvalidOperation:
        # InvalidOperation is an ArithmeticError; keep the "malformed input -> ValueError" contract.
        raise ValueError(f"invalid numeric: {s!r}") from None


def _bool(s: str) -> bool:
    if s == "t":
        return True
    if s == "f":
        return False
    raise ValueError(f"invalid bool: {s!r}")


_date_fromisoformat = date.fromisoformat
_datetime_fromisoformat = datetime.fromisoformat
_time_fromisoformat = time.fromisoformat


def _date(s: str) -> date | str:
    try:
        return _date_fromisoformat(s)
    except ValueError:
        return s  # infinity, -infinity, 'YYYY-MM-DD BC', years beyond 9999


def _datetime(s: str) -> datetime | str:
    # Serves timestamp and timestamptz: fromisoformat (3.11+) takes the space separator, 1-6 fraction
    # digits and PostgreSQL's offsets '+00', '+05:30', '-03', '+05:53:28'.
    try:
        return _datetime_fromisoformat(s)
    except ValueError:
        return s


def _time(s: str) -> time | str:
    try:
        return _time_fromisoformat(s)
    except ValueError:
        return s  # '24:00:00' is a valid PostgreSQL time


# A backslash followed by anything but another backslash or three octal digits is invalid.
_BYTEA_ESCAPE: Final = re.compile(rb"\\(\\|[0-7]{3}|)")


def _bytea_escape_sub(m: re.Match[bytes]) -> bytes:
    g = m.group(1)
    if g == b"\\":
        return g
    if not g:
        raise ValueError("invalid bytea escape sequence")
    return bytes((int(g, 8),))


def _bytea(b: bytes) -> bytes:
    if b[:2] == b"\\x":
        return binascii.unhexlify(b[2:])  # binascii.Error is a ValueError
    # bytea_output = 'escape': printable bytes verbatim, '\\\\' for a backslash, '\\ooo' otherwise.
    if b"\\" not in b:
        return b
    return _BYTEA_ESCAPE.sub(_bytea_escape_sub, b)


def _bytea_str(s: str) -> bytes:
    return _bytea(s.encode())


_json_loads = json.loads

# --- arrays --------------------------------------------------------------------------------------

# Exactly the characters array_in/array_out treat as whitespace; str.isspace()/\s would also match
# e.g. U+00A0, which PostgreSQL leaves unquoted inside elements.
_WS = " \t\n\r\v\f"
_NEEDS_GENERAL_PARSER: Final = re.compile(rf'["\\{_WS}]')
_TOKEN: Final = re.compile(
    rf"""[{_WS}]*(?:
        (?P<open>\{{) | (?P<close>\}}) | (?P<comma>,)
      | "(?P<quoted>(?:[^"\\]|\\.)*)"
      | (?P<bare>(?:[^{{}},"\\{_WS}]|\\.)+(?:[{_WS}]+(?:[^{{}},"\\{_WS}]|\\.)+)*)
    )[{_WS}]*""",
    re.VERBOSE | re.DOTALL,
)
_UNESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)
# Unquoted NULL is case-insensitive in array_in; a set of all 16 spellings is one hash lookup.
_NULLS: Final = frozenset("".join(chars) for chars in product(*zip("NULL", "null", strict=True)))

ElementParser: TypeAlias = Callable[[str], object] | None  # None: elements stay str


def parse_array(text: str, element: ElementParser = None) -> list[object]:
    """Parse a PostgreSQL array literal into (nested) lists; NULL elements become None.

    ``element`` converts each non-NULL element string. Explicit bounds decoration ("[0:1]={...}",
    printed when a lower bound is not 1) is accepted and dropped: Python lists are 0-based anyway.
    """
    if text[:1] == "[":
        eq = text.find("=")
        if eq < 0:
            raise ValueError(f"malformed array literal: {text[:50]!r}")
        text = text[eq + 1 :]
    if (
        _NEEDS_GENERAL_PARSER.search(text) is None
        and text[:1] == "{"
        and text[-1:] == "}"
        and text.find("{", 1) < 0
        and text.find("}", 1, -1) < 0
    ):
        # Fast path, the common output shape: one dimension, nothing quoted or escaped.
        if text == "{}":
            return []
        items = text[1:-1].split(",")
        if "" in items:
            raise ValueError(f"malformed array literal: {text[:50]!r}")
        if element is None:
            return [None if item in _NULLS else item for item in items]
        return [None if item in _NULLS else element(item) for item in items]
    return _parse_array_general(text, element)


def _parse_array_general(text: str, element: ElementParser) -> list[object]:
    match = _TOKEN.match
    end = len(text)
    pos = 0
    root: list[object] | None = None
    stack: list[list[object]] = []
    # Per open level: did it receive sub-arrays (True), scalars (False), or nothing yet (None)?
    # Tracked apart from the values because a json element may itself convert to a list.
    nested: list[bool | None] = []
    # True when the next token must be an element or '{' (after '{' or ','), False after an element.
    expect_item = True
    # After '{' a '}' is allowed immediately (empty array); after ',' it is not.
    allow_close = False
    while pos < end:
        m = match(text, pos)
        if m is None:
            raise ValueError(f"malformed array literal at offset {pos}: {text[:50]!r}")
        pos = m.end()
        kind = m.lastgroup
        if root is not None:
            raise ValueError(f"junk after array literal: {text[:50]!r}")
        if kind == "open":
            if not expect_item:
                raise ValueError(f"unexpected '{{' at offset {m.start()}: {text[:50]!r}")
            new: list[object] = []
            if stack:
                if nested[-1] is False:
                    raise ValueError(f"mixed dimensions in array literal: {text[:50]!r}")
                nested[-1] = True
                stack[-1].append(new)
            stack.append(new)
            nested.append(None)
            expect_item, allow_close = True, True
        elif kind == "close":
            if not stack or (expect_item and not allow_close):
                raise ValueError(f"unexpected '}}' at offset {m.start()}: {text[:50]!r}")
            done = stack.pop()
            nested.pop()
            if not stack:
                root = done
            expect_item, allow_close = False, False
        elif kind == "comma":
            if expect_item or not stack:
                raise ValueError(f"unexpected ',' at offset {m.start()}: {text[:50]!r}")
            expect_item, allow_close = True, False
        else:
            if not expect_item or not stack or nested[-1]:
                raise ValueError(f"unexpected element at offset {m.start()}: {text[:50]!r}")
            nested[-1] = False
            raw = m.group(kind)
            value: object
            if kind == "bare" and "\\" not in raw and raw in _NULLS:
                value = None  # only an unquoted, unescaped NULL is SQL NULL
            else:
                if "\\" in raw:
                    raw = _UNESCAPE.sub(r"\1", raw)
                value = raw if element is None else element(raw)
            stack[-1].append(value)
            expect_item, allow_close = False, False
    if root is None:
        raise ValueError(f"unterminated array literal: {text[:50]!r}")
    return root


# --- converter table -----------------------------------------------------------------------------

_decode: Final = bytes.decode  # UTF-8, strict


def _from_str(parse: Callable[[str], object]) -> Converter:
    def convert(value: bytes) -> object:
        return parse(_decode(value))

    return convert


def _array_of(element: ElementParser) -> Converter:
    def convert(value: bytes) -> list[object]:
        return parse_array(_decode(value), element)

    return convert


def _bool_bytes(b: bytes) -> bool:
    if b == b"t":
        return True
    if b == b"f":
        return False
    raise ValueError(f"invalid bool: {b!r}")


def _json_bytes(b: bytes) -> object:
    return _json_loads(_decode(b))  # loads(bytes) would sniff the encoding on every call


_uuid_from_str: Final[Callable[[str], object]] = UUID

# Per-type parsers for array elements (str in); None keeps elements as str.
_ELEMENTS: Final[dict[int, ElementParser]] = {
    OID.INT2: int,
    OID.INT4: int,
    OID.INT8: int,
    OID.OID: int,
    OID.NUMERIC: _numeric,
    OID.FLOAT4: float,
    OID.FLOAT8: float,
    OID.BOOL: _bool,
    OID.TEXT: None,
    OID.VARCHAR: None,
    OID.BPCHAR: None,
    OID.NAME: None,
    OID.CHAR: None,
    OID.UUID: _uuid_from_str,
    OID.DATE: _date,
    OID.TIME: _time,
    OID.TIMESTAMP: _datetime,
    OID.TIMESTAMPTZ: _datetime,
    OID.JSON: _json_loads,
    OID.JSONB: _json_loads,
    OID.BYTEA: _bytea_str,
}

_ARRAYS: Final = {
    OID.INT2_ARRAY: OID.INT2,
    OID.INT4_ARRAY: OID.INT4,
    OID.INT8_ARRAY: OID.INT8,
    OID.OID_ARRAY: OID.OID,
    OID.NUMERIC_ARRAY: OID.NUMERIC,
    OID.FLOAT4_ARRAY: OID.FLOAT4,
    OID.FLOAT8_ARRAY: OID.FLOAT8,
    OID.BOOL_ARRAY: OID.BOOL,
    OID.TEXT_ARRAY: OID.TEXT,
    OID.VARCHAR_ARRAY: OID.VARCHAR,
    OID.BPCHAR_ARRAY: OID.BPCHAR,
    OID.NAME_ARRAY: OID.NAME,
    OID.CHAR_ARRAY: OID.CHAR,
    OID.UUID_ARRAY: OID.UUID,
    OID.DATE_ARRAY: OID.DATE,
    OID.TIME_ARRAY: OID.TIME,
    OID.TIMESTAMP_ARRAY: OID.TIMESTAMP,
    OID.TIMESTAMPTZ_ARRAY: OID.TIMESTAMPTZ,
    OID.JSON_ARRAY: OID.JSON,
    OID.JSONB_ARRAY: OID.JSONB,
    OID.BYTEA_ARRAY: OID.BYTEA,
}

# int()/float() accept ASCII bytes directly, so those skip the decode step.
_CONVERTERS: dict[int, Converter] = {
    OID.INT2: int,
    OID.INT4: int,
    OID.INT8: int,
    OID.OID: int,
    OID.FLOAT4: float,
    OID.FLOAT8: float,
    OID.NUMERIC: _from_str(_numeric),
    OID.BOOL: _bool_bytes,
    OID.TEXT: _decode,
    OID.VARCHAR: _decode,
    OID.BPCHAR: _decode,
    OID.NAME: _decode,
    OID.CHAR: _decode,
    OID.UUID: _from_str(_uuid_from_str),
    OID.DATE: _from_str(_date),
    OID.TIME: _from_str(_time),
    OID.TIMESTAMP: _from_str(_datetime),
    OID.TIMESTAMPTZ: _from_str(_datetime),
    OID.JSON: _json_bytes,
    OID.JSONB: _json_bytes,
    OID.BYTEA: _bytea,
}
for _array_oid, _element_oid in _ARRAYS.items():
    _CONVERTERS[_array_oid] = _array_of(_ELEMENTS[_element_oid])
del _array_oid, _element_oid


def converter(type_oid: int) -> Converter:
    """Converter for a text-format value of ``type_oid``; unknown types decode to str (UTF-8)."""
    conv = _CONVERTERS.get(type_oid)
    if conv is None:
        conv = _CONVERTERS[type_oid] = _decode
    return conv


# Exact JSON for converted values lives in pgjson.py; re-exported for callers of this module.
from cdc_pipeline.postgres.pgjson import dumps, to_json_value  # noqa: E402
