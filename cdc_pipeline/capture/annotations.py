"""Transaction annotations: a JSON object the application attaches to the changes of its transaction.

The application calls ``pg_logical_emit_message(true, 'cdc_pipeline:annotations', '<json object>')`` inside
its transaction; every change of that transaction logged after the message carries the object (the last
one, when there are several) in ``metadata.annotations``. Changes before it carry none: the drain writes
changes as they stream and does not hold a transaction back to wait for a later message.

Parsing is pure. Content the change log's ``jsonb`` column would refuse (not an object, not JSON, NaN,
NUL in a string, lone surrogates, numbers out of numeric's range) is rejected here, so a bad annotation
is logged and ignored and never makes the drain's COPY fail (which would wedge the slot).
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation

ANNOTATIONS_PREFIX = "cdc_pipeline:annotations"
# numeric's range: 131072 digits before the decimal point, 16383 after.
_MAX_EXPONENT = 131_000


def _number(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation as exc:  # pragma: no cover - json only passes number literals here
        raise ValueError(f"bad number {text[:40]!r}") from exc
    if not value.is_finite() or abs(value.adjusted()) > _MAX_EXPONENT:
        raise ValueError("number out of range")
    return value


def _constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _check_strings(value: object) -> None:
    """Every string (keys too) must be storable: no NUL, valid UTF-8 (no lone surrogates)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError("a string holds NUL (\\u0000)")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("a string holds a lone surrogate") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def parse(content: bytes) -> tuple[str | None, str | None]:
    """(the annotation's JSON text, None) or (None, why it is refused). The text is the content as sent:
    the change log stores it as jsonb."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (at byte {exc.start})"
    try:
        value = json.loads(text, parse_float=_number, parse_int=_number, parse_constant=_constant)
        if not isinstance(value, dict):
            return None, f"not a JSON object but {type(value).__name__}"
        _check_strings(value)
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as exc:  # JSONDecodeError (says where, not what) and the checks above
        return None, f"{type(exc).__name__}: {exc}"[:200]
    return text, None
