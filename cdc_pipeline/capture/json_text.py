"""pgoutput text values -> JSON fragments, equal to what PostgreSQL's ``to_jsonb`` makes of the value. Pure.

The change log stores records as jsonb, and backfills read rows with ``to_jsonb(row)``: so a change and a read
of the same row give the same JSON. Each column gets an encoder made once per relation from its type's catalog
facts (postgres/pgtypeinfo.py), following ``to_jsonb``'s rules: domains are looked through; numbers stay numbers
(NaN and the infinities become strings; jsonb normalises ``1e+100`` and ``-0`` as to_jsonb does); booleans are
``true``/``false``; dates and timestamps take the ISO 8601 form with a ``T``; arrays become (nested) JSON
arrays without their bounds; composites objects of their attributes; json and jsonb are embedded; anything
else is the JSON string of the value's text. Converting text straight to a JSON fragment (no Python value
in between) is also what keeps the drain fast. Sessions print values with fixed settings (postgres/session.py).

A ``json`` value jsonb cannot store (``json_refusal``): a NUL escape is logged as the six characters
``\\u0000`` (an escaped backslash, the documented rule since 9.7); any other refusal (a lone or misordered
surrogate escape, a number beyond numeric's range) makes the value the JSON string of its exact text. The
backfill reads it the same way (backfill/reader.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from functools import cache
from typing import Final

from cdc_pipeline.postgres.oids import ARRAY_ELEMENT, OID
from cdc_pipeline.postgres.pgarray import parse_array
from cdc_pipeline.postgres.pgcomposite import parse_record
from cdc_pipeline.postgres.pgtypeinfo import JsonKind, PgType, json_kind, resolved

# json's C string encoder: escapes and quotes in one call.
_quote: Callable[[str], str] = json.encoder.encode_basestring  # type: ignore[attr-defined]

Fragment = Callable[[bytes], str]
TextFragment = Callable[[str], str]

_SPECIAL_NUMBERS: Final = {"NaN": '"NaN"', "Infinity": '"Infinity"', "-Infinity": '"-Infinity"'}

# --- json that jsonb refuses -----------------------------------------------------------------------

# A `\u0000` escape (after an even number of backslashes).
_NUL_ESCAPE: Final = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
# What may make jsonb refuse a json text: a \u escape, an exponent, or a digit run long enough to pass
# numeric's 16383 fraction digits. Texts without any of these are taken as they are (the common case).
_SUSPECT: Final = re.compile(r"\\u|[0-9.][eE]|[0-9]{16384}")
_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_ESCAPE: Final = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?")
_EXPONENT_LIMIT: Final = 1073741823  # numeric_in: |exponent| < INT_MAX / 2
_MAX_WEIGHT_DIGITS: Final = 131072  # digits before the decimal point
_MAX_DSCALE: Final = 16383  # digits after it


def _string_refusal(body: str) -> str | None:
    """Why jsonb refuses a json string's body (between the quotes), or None."""
    pending = -1  # where the escape after a high surrogate escape must start (a low surrogate escape), or -1
    for m in _ESCAPE.finditer(body):
        esc = m.group(1)
        code = int(esc[1:], 16) if esc[0] == "u" else None
        low = code is not None and 0xDC00 <= code <= 0xDFFF
        if pending >= 0:
            if not low or m.start() != pending:
                return "a high surrogate escape not followed by a low one"
            pending = -1
            continue
        if code is None:
            continue
        if code == 0:
            return "a NUL escape"
        if low:
            return "a low surrogate escape without a high one before it"
        if 0xD800 <= code <= 0xDBFF:
            pending = m.end()
    return "a high surrogate escape not followed by a low one" if pending >= 0 else None


def _number_refusal(literal: str, exponent: str | None) -> str | None:
    """Why numeric_in refuses a JSON number literal, or None."""
    if exponent is not None and (len(exponent.lstrip("+-")) > 10 or abs(int(exponent)) >= _EXPONENT_LIMIT):
        return "a number exponent out of numeric's range"
    d = Decimal(literal)
    if max(0, -int(d.as_tuple().exponent)) > _MAX_DSCALE:
        return "a number with more fraction digits than numeric holds"
    if d and d.adjusted() + 1 > _MAX_WEIGHT_DIGITS:
        return "a number beyond numeric's range"
    return None


def json_refusal(text: str) -> str | None:
    """Why ``jsonb`` would refuse this valid ``json`` text, or None when it takes it. Matches PostgreSQL 15's
    jsonb input: NUL escapes, lone or misordered surrogate escapes, numbers numeric cannot hold."""
    if _SUSPECT.search(text) is None:
        return None
    pos = 0
    for m in _STRING.finditer(text):
        why = _numbers_refusal(text[pos:m.start()]) or (
            _string_refusal(m.group()[1:-1]) if "\\" in m.group() else None)
        if why:
            return why
        pos = m.end()
    return _numbers_refusal(text[pos:])


def _numbers_refusal(segment: str) -> str | None:
    """Why jsonb refuses a number in a stretch of json text outside strings, or None."""
    for m in _NUMBER.finditer(segment):
        if m.group(2) is not None or len(m.group()) > _MAX_DSCALE:
            why = _number_refusal(m.group(), m.group(2))
            if why:
                return why
    return None


def escape_nul(text: str) -> str:
    """json text -> the same text with each NUL escape (backslash-u0000) turned into an escaped backslash + `u0000`."""
    return _NUL_ESCAPE.sub(lambda m: m.group(1) + "\\\\u0000", text)


def json_text(text: str) -> str:
    """A ``json`` value's JSON fragment: as it is, NUL escapes escaped, or the string of its exact text when
    jsonb refuses it for another reason."""
    if _SUSPECT.search(text) is None:
        return text
    if "\\u0000" in text:
        escaped = escape_nul(text)
        return escaped if json_refusal(escaped) is None else _quote(text)
    return text if json_refusal(text) is None else _quote(text)


# --- scalar encoders on text -----------------------------------------------------------------------


def _number(text: str) -> str:
    return _SPECIAL_NUMBERS.get(text, text)


def _bool(text: str) -> str:
    return "true" if text == "t" else "false"


def _identity(text: str) -> str:
    return text


def _iso_t(text: str) -> tuple[str, str]:
    """'YYYY-MM-DD HH:MM:SS...[ BC]' -> ('YYYY-MM-DDTHH:MM:SS...', ' BC' or '')."""
    era = ""
    if text.endswith(" BC"):
        text, era = text[:-3], " BC"
    return text.replace(" ", "T", 1), era


def _timestamp(text: str) -> str:
    if not text[:1].isdigit():  # infinity, -infinity
        return _quote(text)
    body, era = _iso_t(text)
    return _quote(body + era)


def _timestamptz(text: str) -> str:
    if not text[:1].isdigit():
        return _quote(text)
    body, era = _iso_t(text)
    # PostgreSQL's ISO style prints whole-hour offsets as +HH; to_jsonb's XSD style as +HH:MM.
    if body[-3] in "+-":
        body += ":00"
    return _quote(body + era)


_TEXT_ENCODERS: Final[dict[JsonKind, TextFragment]] = {
    JsonKind.BOOL: _bool,
    JsonKind.NUMBER: _number,
    JsonKind.DATE: _quote,  # ISO dates (with ' BC') are what to_jsonb prints
    JsonKind.TIMESTAMP: _timestamp,
    JsonKind.TIMESTAMPTZ: _timestamptz,
    JsonKind.JSON: json_text,
    JsonKind.JSONB: _identity,
    JsonKind.STRING: _quote,
}


def _text_encoder(t: PgType) -> TextFragment:
    """Text of a value of ``t`` (as the type's output function prints it) -> its to_jsonb JSON."""
    kind = json_kind(t)
    if kind is JsonKind.ARRAY:
        element = resolved(t).element
        assert element is not None
        return _array_encoder(_text_encoder(element), resolved(element).delimiter)
    if kind is JsonKind.COMPOSITE:
        return _composite_encoder(resolved(t).attributes)
    return _TEXT_ENCODERS[kind]


def _array_encoder(element: TextFragment, delimiter: str) -> TextFragment:
    def render(value: object) -> str:
        if value is None:
            return "null"
        if isinstance(value, list):
            return "[" + ",".join(render(v) for v in value) + "]"
        return element(value)  # type: ignore[arg-type]

    def encode(text: str) -> str:
        return render(parse_array(text, None, delimiter))

    return encode


def _composite_encoder(attributes: tuple[tuple[str, PgType], ...]) -> TextFragment:
    keys = [_quote(name) + ":" for name, _ in attributes]
    encoders = [_text_encoder(t) for _, t in attributes]

    def encode(text: str) -> str:
        fields = parse_record(text)
        if len(fields) != len(keys):
            raise ValueError(f"record literal with {len(fields)} fields for a type of {len(keys)}")
        return "{" + ",".join(k + ("null" if f is None else enc(f))
                              for k, enc, f in zip(keys, encoders, fields, strict=True)) + "}"

    return encode


# --- per-column fragments on bytes -----------------------------------------------------------------


def _raw_number(raw: bytes) -> str:
    text = raw.decode()
    return _SPECIAL_NUMBERS.get(text, text)


def _raw_bool(raw: bytes) -> str:
    return "true" if raw == b"t" else "false"


def _raw_json(raw: bytes) -> str:
    return raw.decode()


def _raw_string(raw: bytes) -> str:
    return _quote(raw.decode())


def _on_bytes(encode: TextFragment) -> Fragment:
    def fragment(raw: bytes) -> str:
        return encode(raw.decode())

    return fragment


_FAST: Final[dict[JsonKind, Fragment]] = {
    JsonKind.NUMBER: _raw_number, JsonKind.BOOL: _raw_bool, JsonKind.JSONB: _raw_json,
    JsonKind.STRING: _raw_string, JsonKind.DATE: _raw_string,
}


def fragment_for_type(t: PgType) -> Fragment:
    """The encoder for values of ``t``: text bytes from pgoutput -> JSON text."""
    fast = _FAST.get(json_kind(t))
    return fast if fast is not None else _on_bytes(_text_encoder(t))


@cache
def fragment_for(type_oid: int) -> Fragment:
    """The encoder for a built-in type known by OID alone (postgres/oids.py); other types: their text as a
    JSON string. The drain uses ``fragment_for_type`` with the catalog's facts."""
    element = ARRAY_ELEMENT.get(type_oid)  # type: ignore[call-overload]
    if element is not None:
        return fragment_for_type(PgType(type_oid, "", "b", element=PgType(int(element), "", "b")))
    kind = "b" if type_oid in set(OID) else "x"
    return fragment_for_type(PgType(type_oid, "", kind))


def quote_name(name: str) -> str:
    return _quote(name)
