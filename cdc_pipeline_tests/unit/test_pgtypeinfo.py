"""Pure cores of value fidelity: composite literals, json refusals and mirror plans (no I/O)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.capture.json_text import json_refusal, json_text
from cdc_pipeline.postgres.oids import OID
from cdc_pipeline.postgres.pgcomposite import parse_record
from cdc_pipeline.postgres.pgtypeinfo import PgType, TextRule, mirror_plan

hyp = settings(database=None, max_examples=300)
PG_SPECIAL = '",()\\'


def record_out(fields: list[str | None]) -> str:
    """record_out's quoting: empty strings and values with specials or whitespace are quoted, with quotes
    and backslashes doubled."""
    def one(v: str | None) -> str:
        if v is None:
            return ""
        if v == "" or any(c in PG_SPECIAL or c.isspace() for c in v):
            return '"' + v.replace('"', '""').replace("\\", "\\\\") + '"'
        return v

    return "(" + ",".join(one(v) for v in fields) + ")"


@hyp
@given(st.lists(st.one_of(st.none(), st.text(max_size=8)), min_size=1, max_size=6))
def test_parse_record_reads_what_record_out_prints(fields: list[str | None]) -> None:
    assert parse_record(record_out(fields)) == fields


def test_parse_record_takes_backslash_escapes_as_record_in_does() -> None:
    assert parse_record(r'(a\,b,"x\"y",\\)') == ["a,b", 'x"y', "\\"]


def test_json_refusals() -> None:
    assert json_refusal(r'{"a": "\ud83d\ude04"}') is None
    assert json_refusal(r'{"a": "\ud83d\ud83d"}') is not None
    assert json_refusal(r'"\ud83d\\"') is not None  # a high surrogate before an escaped backslash
    assert json_refusal(r'"\\ud800"') is None  # an escaped backslash, then text
    assert json_refusal('{"n": 1e131071}') is None and json_refusal('{"n": 1e131072}') is not None
    assert json_refusal("1e-16383") is None and json_refusal("1.5e-16383") is not None
    assert json_text(r'"\ude04X"') == r'"\"\\ude04X\""'  # the JSON string of the exact text


def t(oid: int, kind: str = "b", **kw: object) -> PgType:
    return PgType(oid, f"t{oid}", kind, **kw)  # type: ignore[arg-type]


def test_mirror_plans() -> None:
    int4, f8, jsonb, json = t(OID.INT4), t(OID.FLOAT8), t(OID.JSONB), t(OID.JSON)
    assert mirror_plan(int4, "integer") == mirror_plan(int4, "integer")
    assert mirror_plan(int4, "integer").rule is TextRule.NEVER
    assert mirror_plan(f8, "double precision").rule is TextRule.NEGATIVE_ZERO
    assert mirror_plan(jsonb, "jsonb").rule is TextRule.JSON_NULL
    assert mirror_plan(json, "json").rule is TextRule.JSON
    assert mirror_plan(t(OID.INT4_ARRAY, element=int4), "integer[]").rule is TextRule.BOUNDS
    assert mirror_plan(t(OID.FLOAT8_ARRAY, element=f8), "double precision[]").rule is TextRule.ALWAYS
    dnum = t(20000, "d", base=t(OID.NUMERIC), base_typmod=655366, base_sql="numeric(10,2)")
    assert (mirror_plan(dnum, "dnum").sql, mirror_plan(dnum, "dnum").rule) == ("numeric(10,2)", TextRule.NEVER)
    assert mirror_plan(t(20001, element=dnum), "dnum[]").sql == "numeric(10,2)[]"
    comp = t(20002, "c", attributes=(("i", int4),))
    assert (mirror_plan(comp, "c").sql, mirror_plan(comp, "c").rule) == ("text", TextRule.ALWAYS)
    mood = t(20003, "e")
    assert (mirror_plan(mood, "mood").sql, mirror_plan(mood, "mood").rule) == ("text", TextRule.NEVER)
    assert (mirror_plan(t(20004, element=mood), "mood[]").sql, mirror_plan(t(20004, element=mood), "mood[]").rule) \
        == ("text[]", TextRule.BOUNDS)
    assert mirror_plan(t(20005, element=comp), "c[]").rule is TextRule.ALWAYS
    darr = t(20006, "d", base=t(OID.INT4_ARRAY, element=int4), base_sql="integer[]")
    assert (mirror_plan(darr, "darr").sql, mirror_plan(darr, "darr").rule) == ("integer[]", TextRule.BOUNDS)
