"""Exact, compact JSON for values converted from PostgreSQL (pgtypes.py): Decimals keep every digit,
times are ISO 8601, bytes are '\\x..' hex, UUIDs strings; non-finite numbers are PostgreSQL's names.
No I/O happens here.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

__all__ = ["dumps", "to_json_value"]

# json can only emit a default() result as a string, so finite Decimals are emitted as a string
# wrapped in a per-process random marker, and the quotes+markers are stripped afterwards. A collision
# needs a source string that starts with the 128-bit random marker.
_MARK: Final = "@dec" + secrets.token_hex(16) + "@"
_OPEN: Final = '"' + _MARK
_CLOSE: Final = _MARK + '"'


def _nonfinite_name(x: float | Decimal) -> str:
    # x.is_nan() for Decimal: comparing a signalling NaN would raise InvalidOperation.
    if x.is_nan() if isinstance(x, Decimal) else x != x:
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def _decimal_json(d: Decimal) -> str:
    if d.is_finite():
        # 'f' prints plain digits like PostgreSQL's numeric output (no exponent), exactly.
        return _MARK + format(d, "f") + _MARK
    return _nonfinite_name(d)


def _bytes_json(b: bytes | bytearray | memoryview) -> str:
    return "\\x" + bytes(b).hex()


def _isoformat(v: date | time) -> str:
    return v.isoformat()


_DEFAULT_BY_TYPE: Final[dict[type, Callable[[Any], object]]] = {
    Decimal: _decimal_json,
    datetime: _isoformat,
    date: _isoformat,
    time: _isoformat,
    UUID: str,
    bytes: _bytes_json,
    bytearray: _bytes_json,
    memoryview: _bytes_json,
}


def _default(o: object) -> object:
    fn = _DEFAULT_BY_TYPE.get(type(o))
    if fn is not None:
        return fn(o)
    # Subclasses (e.g. pendulum datetimes) are rare; check them after the exact-type fast path.
    if isinstance(o, Decimal):
        return _decimal_json(o)
    if isinstance(o, date | time):
        return o.isoformat()
    if isinstance(o, UUID):
        return str(o)
    if isinstance(o, bytes | bytearray | memoryview):
        return _bytes_json(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


# One reusable encoder: json.dumps(..., default=...) would build a new JSONEncoder per call.
_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_default
)
_encode: Callable[[object], str] = _ENCODER.encode
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
if _c_make_encoder is not None:
    # JSONEncoder.encode builds a fresh C encoder per call; building it once halves the cost for
    # small records. Same settings as _ENCODER, minus the circular-reference check (markers=None):
    # change records are trees, and a cycle would still fail, with RecursionError.
    _c_encoder = _c_make_encoder(
        None, _default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )

    def _encode(obj: object) -> str:
        return "".join(_c_encoder(obj, 0))


def _finite_floats(obj: object) -> object:
    """Copy of ``obj`` with non-finite floats replaced by PostgreSQL's names for them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else _nonfinite_name(obj)
    if isinstance(obj, dict):
        return {k: _finite_floats(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite_floats(v) for v in obj]
    return obj


def dumps(obj: object) -> str:
    """Compact JSON for change records: exact Decimals, ISO-8601 times, '\\x..' bytes, UUID strings.

    Non-finite floats and Decimals become the strings "NaN", "Infinity", "-Infinity".
    """
    try:
        out = _encode(obj)
    except ValueError:
        # allow_nan=False rejects NaN/inf floats; they are rare, so sanitise and retry only then.
        out = _encode(_finite_floats(obj))
    if _MARK in out:
        out = out.replace(_OPEN, "").replace(_CLOSE, "")
    return out


def to_json_value(value: object) -> object:
    """Map a converted value (or dict/list of them) to what ``dumps`` would emit, as Python objects.

    Finite Decimals are returned unchanged (float would lose digits); serialise with ``dumps``,
    which writes them as exact JSON numbers. Everything else becomes JSON-native.
    """
    t = type(value)
    if value is None or t is str or t is int or t is bool:
        return value
    if t is float:
        return value if math.isfinite(value) else _nonfinite_name(value)  # type: ignore[arg-type]
    if isinstance(value, Decimal):
        return value if value.is_finite() else _nonfinite_name(value)
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else _nonfinite_name(value)
    if isinstance(value, int | str):
        return value
    return _default(value)
