"""pgoutput text values -> JSON fragments, matching PostgreSQL's own `to_jsonb` output.

The change log stores records as jsonb, and backfills read rows with `to_jsonb(row)`: so a change and
a read of the same row must produce the same JSON. Converting text straight to a JSON fragment (no
Python value in between) is also what keeps the drain fast. Requires the replication session to run
with TimeZone=UTC, as `to_jsonb` does in the backfill session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache

from cdc_pipeline.postgres import pgtypes
from cdc_pipeline.postgres.oids import ARRAY_ELEMENT, NUMBERS, OID

# json's C string encoder: escapes and quotes in one call.
_quote: Callable[[str], str] = json.encoder.encode_basestring  # type: ignore[attr-defined]

# A `\u0000` escape (after an even number of backslashes): valid in json, refused by jsonb, which the
# change log stores records as. It is logged as the six characters `\u0000` (an escaped backslash), so
# the row is logged instead of stopping the drain; the backfill reads it the same way (backfill/reader.py).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
_SPECIAL_NUMBERS = {"NaN": '"NaN"', "Infinity": '"Infinity"', "-Infinity": '"-Infinity"'}

Fragment = Callable[[bytes], str]


def _number(raw: bytes) -> str:
    text = raw.decode()
    return _SPECIAL_NUMBERS.get(text, text)


def _bool(raw: bytes) -> str:
    return "true" if raw == b"t" else "false"


def _raw_json(raw: bytes) -> str:
    return raw.decode()


def _json(raw: bytes) -> str:
    text = raw.decode()
    if "\\u0000" not in text:
        return text
    return escape_nul(text)


def escape_nul(text: str) -> str:
    """json text -> the same text with each NUL escape (backslash-u0000) turned into an escaped backslash + `u0000`."""
    return _NUL_ESCAPE.sub(lambda m: m.group(1) + "\\\\u0000", text)


def _string(raw: bytes) -> str:
    return _quote(raw.decode())


def _timestamp(raw: bytes) -> str:
    text = raw.decode()
    if text[0].isdigit() and not text.endswith(" BC"):
        text = text.replace(" ", "T", 1)
    return _quote(text)


def _timestamptz(raw: bytes) -> str:
    text = raw.decode()
    if text[0].isdigit() and not text.endswith(" BC"):
        text = text.replace(" ", "T", 1)
        # PostgreSQL prints whole-hour offsets as +HH; to_jsonb as +HH:MM.
        if text[-3] in "+-":
            text += ":00"
    return _quote(text)


def _array(type_oid: int) -> Fragment:
    convert = pgtypes.converter(type_oid)

    def fragment(raw: bytes) -> str:
        return pgtypes.dumps(convert(raw))

    return fragment


@cache
def fragment_for(type_oid: int) -> Fragment:
    """The encoder for values of one type: text bytes from pgoutput -> JSON text."""
    if type_oid in NUMBERS:
        return _number
    if type_oid == OID.BOOL:
        return _bool
    if type_oid == OID.JSONB:
        return _raw_json
    if type_oid == OID.JSON:
        return _json
    if type_oid == OID.TIMESTAMP:
        return _timestamp
    if type_oid == OID.TIMESTAMPTZ:
        return _timestamptz
    if type_oid in ARRAY_ELEMENT:
        return _array(type_oid)
    return _string


def quote_name(name: str) -> str:
    return _quote(name)
