"""Conversion of pgoutput text-format column values to Python, and exact JSON serialisation.

``converter(oid)`` returns a callable turning the raw bytes of a text-format value (PostgreSQL output
format, DateStyle ISO) into a Python value. Converters raise ValueError on malformed input, except the
date/time family: values Python cannot represent (``infinity``, BC dates, years > 9999, ``24:00:00``)
come back as the original ``str`` rather than failing a whole change.

``dumps(obj)`` (pgjson.py) serialises dicts/lists of converted values to compact JSON, keeping
``Decimal`` exact. The type OIDs come from oids.py, array literals are parsed by pgarray.py. No I/O
happens here.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Final, TypeAlias
from uuid import UUID

from cdc_pipeline.postgres.oids import ARRAY_ELEMENT, OID
from cdc_pipeline.postgres.pgarray import ElementParser, parse_array

__all__ = ["OID", "Converter", "converter", "dumps", "parse_array", "to_json_value"]

Converter: TypeAlias = Callable[[bytes], object]


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
for _array_oid, _element_oid in ARRAY_ELEMENT.items():
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
