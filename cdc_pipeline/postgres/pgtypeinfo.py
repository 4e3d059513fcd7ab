"""What the pipeline knows of a column's type from the source catalog, and what follows from it. Pure.

``PgType`` is one pg_type row with what it points to: a domain's base type (and the typmod it applies), an
array's element type, a composite's attributes. From it follow, with no I/O:

* ``json_kind``: how ``to_jsonb`` renders a value of the type (PostgreSQL's own categories: domains are
  looked through, arrays and composites recurse, numbers, booleans, dates/timestamps and json have their
  own forms, everything else is the JSON string of the type's text output);
* ``mirror_plan``: the column type a Postgres mirror gives it, and when a value's JSON form does not give
  the mirror the source's value back (so the change log also keeps the value's text for the mirror).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Final

from cdc_pipeline.postgres.oids import FIRST_USER_OID, OID

# format_type of a built-in type: words, a typmod (a scale may be negative: numeric(3,-6)), array brackets.
TYPE_SQL: Final = re.compile(r'[a-z][a-z0-9_ ]*(\([0-9, -]+\))?[a-z ]*(\[\])*|"char"(\[\])*')


@dataclass(frozen=True, slots=True)
class PgType:
    oid: int
    sql: str  # format_type(oid, NULL)
    kind: str  # pg_type.typtype: b(ase), c(omposite), d(omain), e(num), r(ange), m(ultirange), p(seudo)
    element: PgType | None = None  # arrays
    base: PgType | None = None  # domains
    base_typmod: int = -1  # the typmod a domain applies to its base
    base_sql: str = ""  # format_type(base, base_typmod) for domains
    attributes: tuple[tuple[str, PgType], ...] = ()  # composites, in attribute order
    delimiter: str = ","  # pg_type.typdelim: separates this type's elements in an array literal (box: ';')

    @property
    def builtin(self) -> bool:
        return self.oid < FIRST_USER_OID


def unknown(oid: int) -> PgType:
    """A type the catalog no longer knows (dropped since the change): rendered as its text."""
    return PgType(oid, "text", "b")


def resolved(t: PgType) -> PgType:
    """The type under any domains (what getBaseType gives)."""
    while t.kind == "d" and t.base is not None:
        t = t.base
    return t


def resolved_sql(t: PgType) -> str:
    """The resolved type as SQL with the innermost typmod a domain applies (``numeric(10,2)``)."""
    sql = t.sql
    while t.kind == "d" and t.base is not None:
        sql = t.base_sql or t.base.sql
        t = t.base
    return sql


class JsonKind(Enum):
    BOOL = "bool"
    NUMBER = "number"
    DATE = "date"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    JSON = "json"
    JSONB = "jsonb"
    ARRAY = "array"
    COMPOSITE = "composite"
    STRING = "string"  # the type's text output as a JSON string


_BY_OID: Final = {
    OID.BOOL: JsonKind.BOOL, OID.INT2: JsonKind.NUMBER, OID.INT4: JsonKind.NUMBER, OID.INT8: JsonKind.NUMBER,
    OID.FLOAT4: JsonKind.NUMBER, OID.FLOAT8: JsonKind.NUMBER, OID.NUMERIC: JsonKind.NUMBER,
    OID.DATE: JsonKind.DATE, OID.TIMESTAMP: JsonKind.TIMESTAMP, OID.TIMESTAMPTZ: JsonKind.TIMESTAMPTZ,
    OID.JSON: JsonKind.JSON, OID.JSONB: JsonKind.JSONB,
}


def json_kind(t: PgType) -> JsonKind:
    """``to_jsonb``'s category for values of ``t`` (jsonb.c: jsonb_categorize_type)."""
    t = resolved(t)
    kind = _BY_OID.get(t.oid)  # type: ignore[call-overload]
    if kind is not None:
        return kind
    if t.element is not None:
        return JsonKind.ARRAY
    if t.kind == "c":
        return JsonKind.COMPOSITE
    return JsonKind.STRING


class TextRule(Enum):
    """When a value's JSON form does not give a mirror the source's value back, so the change log keeps the
    value's text for the mirror too (capture/changes.py; backfill/reader.py computes the same in SQL)."""

    NEVER = "never"
    ALWAYS = "always"
    JSON = "json"  # json keeps its exact text (jsonb would normalise it), NUL escapes escaped as in records
    JSON_NULL = "json_null"  # jsonb 'null': JSON null and SQL NULL are both null in a record
    NEGATIVE_ZERO = "negative_zero"  # float -0: to_jsonb prints 0
    BOUNDS = "bounds"  # an array with a lower bound other than 1: to_jsonb drops the bounds

    def wants(self, text: bytes) -> bool:
        if self is TextRule.NEVER:
            return False
        if self is TextRule.ALWAYS or self is TextRule.JSON:
            return True
        if self is TextRule.JSON_NULL:
            return text == b"null"
        if self is TextRule.NEGATIVE_ZERO:
            return text == b"-0"
        return text[:1] == b"["


_FLOATS: Final = frozenset({OID.FLOAT4, OID.FLOAT8})


def _scalar_rule(t: PgType) -> TextRule:
    """The rule for a resolved, non-array type mirrored as itself."""
    if t.oid == OID.JSON:
        return TextRule.JSON
    if t.kind == "c":
        return TextRule.ALWAYS  # composites are objects in JSON
    if t.oid == OID.JSONB:
        return TextRule.JSON_NULL
    if t.oid in _FLOATS:
        return TextRule.NEGATIVE_ZERO
    return TextRule.NEVER


def _array_rule(element: PgType) -> TextRule:
    e = resolved(element)
    if e.oid in (OID.JSON, OID.JSONB, *_FLOATS) or json_kind(e) is JsonKind.COMPOSITE or e.element is not None:
        return TextRule.ALWAYS
    return TextRule.BOUNDS


@dataclass(frozen=True, slots=True)
class MirrorPlan:
    sql: str  # the mirror's column type
    rule: TextRule


def mirror_plan(t: PgType, type_sql: str) -> MirrorPlan:
    """The mirror column type of a source column of type ``t`` (``type_sql``: format_type with the column's
    typmod), and when its values need their text in the log.

    Built-in types keep their type; a domain over a built-in type becomes that base type (with the domain's
    typmod); an array of such domains the base type's array. Other user-defined types (enums, composites,
    ranges, base types, domains over them) become ``text`` (arrays ``text[]``) holding the source's text.
    """
    r = resolved(t)
    if r.builtin and r.element is None:
        return MirrorPlan(type_sql if t is r else resolved_sql(t), _scalar_rule(r))
    if r.element is not None:
        e = resolved(r.element)
        if e.builtin and e.element is None and (r.builtin or e is not r.element):
            if r.builtin:  # a built-in array type, or a domain over one
                return MirrorPlan(type_sql if t is r else resolved_sql(t), _array_rule(e))
            return MirrorPlan(resolved_sql(r.element) + "[]", _array_rule(e))  # an array of domains
        return MirrorPlan("text[]", TextRule.BOUNDS if json_kind(e) is JsonKind.STRING else TextRule.ALWAYS)
    return MirrorPlan("text", TextRule.NEVER if json_kind(r) is JsonKind.STRING else TextRule.ALWAYS)
