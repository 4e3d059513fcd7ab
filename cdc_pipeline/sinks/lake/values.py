"""PostgreSQL column types to the nearest exact Arrow type of a lake format, and a record's values to it.

Pure: a column's type (as `format_type` prints it) and a value as the message carries it (docs: values.md)
in, a Python value for Arrow out. A value the lake type cannot hold exactly (a date `infinity`, `24:00:00`,
`NaN` in a `numeric(p,s)`, an array with other lower bounds, several dimensions) raises `Unrepresentable`:
the message is refused (parked, with the column named) rather than written altered.

Numbers in a record are parsed as `Num` (their JSON text), so a `numeric` of 20,000 digits or `-0` keeps
its exact text until the column's type says what to make of it.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

import pyarrow as pa

Format = Literal["delta", "iceberg"]
EPOCH_DAYS = 719_468  # days from 0000-03-01 to 1970-01-01 (civil-from-days, proleptic Gregorian)
_DEC = re.compile(r"numeric\((\d+),(-?\d+)\)$")
_TS = re.compile(r"(\d{4,})-(\d\d)-(\d\d)(?:[T ](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?([+-]\d\d(?::?\d\d)?(?::\d\d)?)?"
                 r"( BC)?$")
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?$")


class Num(str):
    """A JSON number, kept as its text."""

    __slots__ = ()


class Typed:
    """A value already of its column's type (converted once, or read back from a lake table)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Typed) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value if not isinstance(self.value, list) else tuple(self.value))


class Unrepresentable(ValueError):
    """A value the lake column's type cannot hold exactly."""


def loads(payload: bytes | str) -> Any:
    return json.loads(payload, parse_float=Num, parse_int=Num)


def base_type(type_sql: str, type_oid: int, mirror_type: str | None, first_user_oid: int) -> str:
    """The built-in type a column is written as: a domain's base type; other user types as text."""
    if mirror_type:
        return mirror_type
    if type_oid < first_user_oid:
        return type_sql
    return "text[]" if type_sql.endswith("[]") else "text"


def arrow_type(type_sql: str, fmt: Format) -> pa.DataType:
    if type_sql.endswith("[]"):
        return pa.list_(arrow_type(type_sql[:-2], fmt))
    t = type_sql
    if t == "boolean":
        return pa.bool_()
    if t == "smallint":
        return pa.int16() if fmt == "delta" else pa.int32()  # Iceberg has no 16-bit integer
    if t == "integer":
        return pa.int32()
    if t in ("bigint", "oid"):
        return pa.int64()
    if t == "real":
        return pa.float32()
    if t == "double precision":
        return pa.float64()
    if (m := _DEC.match(t)) and 0 < int(m[1]) <= 38 and 0 <= int(m[2]) <= int(m[1]):
        return pa.decimal128(int(m[1]), int(m[2]))
    if t == "date":
        return pa.date32()
    if t.startswith("timestamp") and "with time zone" in t:
        return pa.timestamp("us", "UTC")
    if t.startswith("timestamp"):
        return pa.timestamp("us")
    if t.startswith("time") and "with time zone" not in t and fmt == "iceberg":  # Delta has no time type
        return pa.time64("us")
    if t == "bytea":
        return pa.binary()
    return pa.string()  # text, numeric beyond decimal(38), interval, ranges, json, enums, uuid, inet, ...


@functools.lru_cache(maxsize=512)
def family(kind: pa.DataType) -> str:
    """What a conversion to `kind` has to do (asked once per type: pyarrow's type tests are slow per value)."""
    t = pa.types
    for name, test in (("list", lambda k: t.is_list(k) or t.is_large_list(k)),
                       ("string", lambda k: t.is_string(k) or t.is_large_string(k)), ("bool", t.is_boolean),
                       ("int", t.is_integer), ("float", t.is_floating), ("decimal", t.is_decimal), ("date", t.is_date),
                       ("timestamp", t.is_timestamp), ("time", t.is_time),
                       ("binary", lambda k: t.is_binary(k) or t.is_large_binary(k))):
        if test(kind):
            return name
    return "other"


def convert(value: Any, text: str | None, kind: pa.DataType) -> Any:
    """The Arrow value of a record's `value` (or, when the log kept it, the value's exact `text`)."""
    if isinstance(value, Typed):
        return value.value
    if value is None and text is None:
        return None
    fam = family(kind)
    if fam == "list":
        if text is not None:  # the array's exact text (its elements' JSON is not exact, or it has bounds)
            return [convert(None, e, kind.value_type) if e is not None else None for e in array_elements(text)]
        if not isinstance(value, list):
            raise Unrepresentable("array expected")
        if any(isinstance(v, list) for v in value):
            raise Unrepresentable("array of more than one dimension")
        return [convert(v, None, kind.value_type) for v in value]
    if fam == "string":
        return text if text is not None else as_text(value)
    raw = text if text is not None else value
    return _scalar(raw, fam, kind)


PYTHON_DAYS = (-719_162, 2_932_896)  # 0001-01-01 and 9999-12-31, in days since 1970-01-01


def check_calendar(value: Any, kind: pa.DataType) -> None:
    """Refuse a date or timestamp (or an array's) outside years 1 to 9999."""
    if isinstance(value, list):
        for v in value:
            check_calendar(v, kind.value_type)
        return
    if value is None:
        return
    fam = family(kind)
    days = value if fam == "date" else value // 86_400_000_000 if fam == "timestamp" else None
    if days is not None and not PYTHON_DAYS[0] <= days <= PYTHON_DAYS[1]:
        raise Unrepresentable("a date outside years 1 to 9999")


def array_elements(text: str) -> list[str | None]:
    """The elements of a one-dimensional array's text (`{a,"b c",NULL}`); other bounds or dimensions refused."""
    if text.startswith("["):
        raise Unrepresentable(f"array with lower bounds {text[:text.find('=') + 1]!r}")
    if not (text.startswith("{") and text.endswith("}")) or text.startswith("{{"):
        raise Unrepresentable("array of more than one dimension")
    out: list[str | None] = []
    i, body = 0, text[1:-1]
    while i < len(body):
        if body[i] == '"':
            j, chars = i + 1, []
            while body[j] != '"':
                if body[j] == "\\":
                    j += 1
                chars.append(body[j])
                j += 1
            out.append("".join(chars))
            i = j + 2  # past the quote and the comma
        else:
            j = body.find(",", i)
            j = len(body) if j < 0 else j
            word = body[i:j]
            out.append(None if word == "NULL" else word)
            i = j + 1
    return out


def _scalar(raw: Any, fam: str, kind: pa.DataType) -> Any:
    if fam == "int":
        return int(raw)
    if fam == "float":
        return float(raw)  # 'NaN', 'Infinity', '-0' included
    if fam == "timestamp":
        return _micros(str(raw))
    if fam == "decimal":
        try:
            number = Decimal(raw)
        except InvalidOperation as exc:
            raise Unrepresentable(f"{raw!r} in decimal") from exc
        if not number.is_finite():
            raise Unrepresentable(f"{raw!r} in decimal")
        return number
    if fam == "bool":
        return raw if isinstance(raw, bool) else raw in ("t", "true")
    if fam == "date":
        return _days(str(raw))
    if fam == "time":
        return _time(str(raw))
    if fam == "binary":
        s = str(raw)
        if not s.startswith("\\x"):
            raise Unrepresentable("bytea expected in hex")
        return bytes.fromhex(s[2:])
    raise Unrepresentable(f"no conversion to {kind}")


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is 0)."""
    y -= m <= 2
    era = y // 400  # floor division: right for negative years too
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - EPOCH_DAYS


def _parts(s: str) -> tuple[int, int]:
    """(days, microseconds of the day, UTC) of an ISO date or timestamp as the log prints them."""
    m = _TS.match(s)
    if m is None:
        raise Unrepresentable(f"{s!r} is no finite date or time")
    year = int(m[1])
    year = 1 - year if m[9] else year
    days = days_from_civil(year, int(m[2]), int(m[3]))
    micros = 0
    if m[4]:
        micros = ((int(m[4]) * 60 + int(m[5])) * 60 + int(m[6])) * 1_000_000 + int((m[7] or "0").ljust(6, "0"))
    if m[8]:  # an offset: to UTC
        sign = -1 if m[8][0] == "-" else 1
        fields = [int(f) for f in re.findall(r"\d\d", m[8][1:])]
        offset = fields[0] * 3600 + (fields[1] if len(fields) > 1 else 0) * 60 + (fields[2] if len(fields) > 2 else 0)
        micros -= sign * offset * 1_000_000
    return days, micros


def _days(s: str) -> int:
    days, micros = _parts(s)
    if micros:
        raise Unrepresentable(f"{s!r} is no date")
    return days


_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def _micros(s: str) -> int:
    if len(s) >= 19 and s[4] == "-" and s[10] == "T" and not s.endswith(" BC"):  # the common case, in C
        try:
            stamp = datetime.fromisoformat(s)
            return (stamp - (_EPOCH if stamp.tzinfo is None else _EPOCH_UTC)) // _MICRO
        except ValueError:
            pass
    days, micros = _parts(s)
    value = days * 86_400_000_000 + micros
    if not -(2**63) <= value < 2**63:  # PostgreSQL's last ~900 years of timestamps are past int64 from 1970
        raise Unrepresentable(f"{s!r} is beyond microseconds since 1970 in 64 bits")
    return value


def _time(s: str) -> int:
    m = _TIME.match(s)
    if m is None or int(m[1]) > 23:
        raise Unrepresentable(f"{s!r} is no time of day below 24:00")
    return ((int(m[1]) * 60 + int(m[2])) * 60 + int(m[3])) * 1_000_000 + int((m[4] or "0").ljust(6, "0"))


def as_text(value: Any) -> str:
    """A record value as text: strings as they are, numbers as their JSON text, objects and arrays (json,
    jsonb, composites) as `jsonb` prints them."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return dump(value)


def dump(value: Any) -> str:
    """JSON as `jsonb::text` prints it (`, ` and `: `), numbers as their original text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Num):
        return str.__str__(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(dump(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {dump(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)
