"""Transaction annotations: a JSON object the application attaches to the changes of its transaction.

The application calls ``pg_logical_emit_message(true, 'cdc_pipeline:annotations', '<json object>')`` inside
its transaction; every change of that transaction logged after the message carries the object (the last
one, when there are several) in ``metadata.annotations``. Changes before it carry none: the drain writes
changes as they stream and does not hold a transaction back to wait for a later message.

Parsing is pure. The content is the application's input: anything the change log's ``jsonb`` column would
refuse (not an object, not JSON, NaN, NUL in a string, lone surrogates, a number ``numeric`` cannot hold),
or larger than ``MAX_BYTES`` (it is copied onto every change after it), is refused here, so a bad
annotation is logged by position and length and skipped and never makes the drain's COPY fail (which
would wedge the slot). Numbers are checked by PostgreSQL's own rule (``numeric_in``/``make_result``:
exponent, display scale and base-10000 weight), tested against the server's jsonb input.
"""

from __future__ import annotations

import json
import re

ANNOTATIONS_PREFIX = "cdc_pipeline:annotations"
# An annotation is copied onto every change of its transaction after it: 64 KiB bounds that copy.
MAX_BYTES = 65536

# numeric_in / make_result (src/backend/utils/adt/numeric.c): the exponent's own bound, the display scale's
# (14 bits) and the base-10000 weight's (int16).
_EXPONENT_BOUND = 2**31 // 2 - 1  # INT_MAX / 2
_DSCALE_MAX = 0x3FFF
_WEIGHT_MIN, _WEIGHT_MAX = -(2**15), 2**15 - 1
_NUMBER = re.compile(r"-?(\d+)(?:\.(\d+))?(?:[eE]([+-]?)(\d+))?")


class Refused(ValueError):
    """Why content is not a storable annotation (never the content itself)."""


def number_problem(token: str) -> str | None:
    """Why ``numeric`` (so ``jsonb``) refuses this JSON number literal, or None if it stores it."""
    match = _NUMBER.fullmatch(token)
    if match is None:
        return "not a number literal"
    whole, fraction, sign, exp_digits = match.groups()
    fraction = fraction or ""
    exponent = 0
    if exp_digits is not None:
        significant = exp_digits.lstrip("0")
        if len(significant) > 10:
            return "number out of numeric's range (exponent)"
        exponent = int(significant or "0") * (-1 if sign == "-" else 1)
        if abs(exponent) >= _EXPONENT_BOUND:
            return "number out of numeric's range (exponent)"
    if max(0, len(fraction) - exponent) > _DSCALE_MAX:
        return "number out of numeric's range (more than 16383 digits after the point)"
    digits = whole + fraction
    first = len(digits) - len(digits.lstrip("0"))
    if first < len(digits):  # zero has weight 0
        weight = (len(whole) - 1 - first + exponent) // 4
        if not _WEIGHT_MIN <= weight <= _WEIGHT_MAX:
            return "number out of numeric's range (magnitude)"
    return None


def _number(token: str) -> str:
    problem = number_problem(token)
    if problem is not None:
        raise Refused(problem)
    return token


def _constant(name: str) -> object:
    raise Refused("NaN or Infinity is not JSON")


def _check_strings(value: object, ascii_only: bool) -> None:
    """Every string (keys too) must be storable: no NUL, valid UTF-8 (no lone surrogates); ASCII only where
    the state database's encoding is not UTF-8 (it may not hold the rest)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise Refused("a string holds NUL (\\u0000)")
            if ascii_only and not item.isascii():
                raise Refused("a string holds non-ASCII characters and the state database is not UTF-8")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise Refused("a string holds a lone surrogate") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def parse(content: bytes, ascii_only: bool = False) -> tuple[str | None, str | None]:
    """(the annotation's JSON text, None) or (None, why it is refused). The text is the content as sent:
    the change log stores it as jsonb. The reason never quotes the content."""
    if len(content) > MAX_BYTES:
        return None, f"larger than {MAX_BYTES} bytes"
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (at byte {exc.start})"
    try:
        value = json.loads(text, parse_float=_number, parse_int=_number, parse_constant=_constant)
        if not isinstance(value, dict):
            return None, f"not a JSON object but {type(value).__name__}"
        _check_strings(value, ascii_only)
    except RecursionError:
        return None, "nested too deeply"
    except Refused as exc:
        return None, str(exc)
    except json.JSONDecodeError as exc:  # its position and kind only (a message may quote a character)
        return None, f"not JSON (at character {exc.pos}: {exc.msg.split(':')[0]})"
    except ValueError as exc:  # pragma: no cover - json raises JSONDecodeError; never print its text
        return None, f"not JSON ({type(exc).__name__})"
    return text, None
