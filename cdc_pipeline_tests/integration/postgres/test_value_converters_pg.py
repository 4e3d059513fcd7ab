"""The pure value converters (capture/json_text.py, postgres/pgcomposite.py, pgtypeinfo.py) against
PostgreSQL's own output, property-based: for values hypothesis makes up, PostgreSQL prints each value's text
and ``to_jsonb``; our fragment made from the text must equal ``to_jsonb`` (as JSON, numbers exact), and
``json_refusal`` must say "refused" exactly when ``jsonb`` refuses a ``json`` text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_pipeline.capture.json_text import fragment_for_type, json_refusal
from cdc_pipeline.postgres import catalog, session
from cdc_pipeline_tests.conftest import Database

hyp = settings(database=None, max_examples=120, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

TYPES = """
CREATE TYPE inner_t AS (i int, r float8);
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN dnum AS numeric(10,2);
CREATE DOMAIN darr AS int[];
CREATE TYPE outer_t AS (a int, t text, ts timestamptz, arr int[], nested inner_t, m mood, d dnum, da darr,
                        j jsonb, b bool);
"""


@pytest.fixture(scope="module")
def pg(pg_admin_dsn: str) -> Iterator[psycopg.Connection]:
    name = "t_converters"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    db = Database(pg_admin_dsn, name)
    with session.connect(db.dsn, autocommit=True) as conn:  # the pipeline's printing settings
        conn.execute(TYPES)
        yield conn
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def exact(text: str) -> Any:
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def check(conn: psycopg.Connection, literal: str, type_sql: str) -> None:
    """PostgreSQL's text and to_jsonb of ``literal::type_sql``; our fragment from the text equals to_jsonb."""
    row = conn.execute("SELECT ({0})::text, to_jsonb({0})::text, pg_typeof({0})::oid".replace(
        "{0}", f"%(v)s::{type_sql}"), {"v": literal}).fetchone()
    assert row is not None
    text, want, oid = row
    if text is None:
        return
    t = catalog.load_types(conn, [int(oid)])[int(oid)]
    got = fragment_for_type(t)(text.encode())
    assert exact(got) == exact(want), (type_sql, text, got, want)


# -- strategies: values as SQL literals --------------------------------------------------------------------

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
pg_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from([-0.0, 1e100, 1.5e-10]))


def float_literal(x: float) -> str:
    return "NaN" if x != x else ("Infinity" if x == float("inf") else "-Infinity" if x == float("-inf") else repr(x))


moments = st.builds(lambda days, us, bc: (datetime(2000, 1, 1, tzinfo=UTC) + timedelta(days=days, microseconds=us),
                                           bc), st.integers(-730000, 2900000), st.integers(0, 86_399_999_999),
                    st.booleans())


def timestamptz_literal(m: tuple[datetime, bool]) -> str:
    value, bc = m
    bc = bc and value.year <= 4713  # the earliest timestamp is 4714-11-24 BC
    return value.strftime("%Y-%m-%d %H:%M:%S.%f") + "+00" + (" BC" if bc else "")


def array_literal(values: list[str | None], lower: int) -> str:
    def element(v: str | None) -> str:
        return "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

    body = "{" + ",".join(element(v) for v in values) + "}"
    return body if lower == 1 or not values else f"[{lower}:{lower + len(values) - 1}]={body}"


@hyp
@given(st.lists(st.one_of(st.none(), texts), max_size=5), st.integers(-3, 3))
def test_text_arrays_with_any_bounds(pg: psycopg.Connection, values: list[str | None], lower: int) -> None:
    check(pg, array_literal(values, lower), "text[]")


@hyp
@given(pg_floats)
def test_floats(pg: psycopg.Connection, x: float) -> None:
    check(pg, float_literal(x), "float8")
    check(pg, "{" + float_literal(x) + ",NULL}", "float8[]")


@hyp
@given(moments)
def test_timestamps_with_eras(pg: psycopg.Connection, m: tuple[datetime, bool]) -> None:
    literal = timestamptz_literal(m)
    check(pg, literal, "timestamptz")
    check(pg, literal.replace("+00", ""), "timestamp")
    check(pg, array_literal([literal, None], 1), "timestamptz[]")


@hyp
@given(st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)), texts, moments, st.lists(st.integers(-9, 9), max_size=3),
       st.one_of(st.none(), pg_floats), st.sampled_from(["sad", "ok", "happy", None]),
       st.decimals(min_value=-10**7, max_value=10**7, places=2, allow_nan=False), st.booleans())
def test_nested_composites_domains_and_enums(pg: psycopg.Connection, a: int | None, t: str, m: tuple[datetime, bool],
                                             arr: list[int], r: float | None, mood: str | None, d: Decimal,
                                             b: bool) -> None:
    row = pg.execute(
        "SELECT ROW(%s, %s, %s::timestamptz, %s::int[], ROW(1, %s::float8)::inner_t, %s::mood, %s::dnum, "
        "%s::darr, %s::jsonb, %s)::outer_t::text",
        (a, t, timestamptz_literal(m), arr, None if r is None else float_literal(r), mood, d, arr,
         json.dumps({"t": t, "n": None}), b)).fetchone()
    assert row is not None
    check(pg, row[0], "outer_t")
    check(pg, array_literal([row[0], None], 0), "outer_t[]")
    check(pg, str(d), "dnum")
    check(pg, "{" + ",".join(map(str, arr)) + "}", "darr")


@hyp
@given(st.lists(st.tuples(st.integers(-99, 99), st.integers(-99, 99), st.integers(-99, 99), st.integers(-99, 99)),
                max_size=3))
def test_box_arrays_use_their_own_delimiter(pg: psycopg.Connection, boxes: list[tuple[int, int, int, int]]) -> None:
    check(pg, "{" + ";".join(f"({a},{b}),({c},{d})" for a, b, c, d in boxes) + "}", "box[]")


# -- json that jsonb refuses -------------------------------------------------------------------------------

escapes = st.one_of(
    st.sampled_from([r"\u0000", r"\ud83d", r"\ude04", r"\ud83d\ude04", r"\udbff\udfff", r"\\", r"\"", r"\n",
                     r"\u00e9", r"\\u0000", r"\\ud800"]),
    st.integers(0, 0xFFFF).map(lambda c: f"\\u{c:04x}"),
)
json_strings = st.lists(st.one_of(escapes, st.sampled_from(["a", " ", "é", "😄"])), max_size=5).map(
    lambda parts: '"' + "".join(parts) + '"')
json_numbers = st.one_of(
    st.builds(lambda m, f, e: f"{m}{'.' + f if f else ''}e{e}", st.integers(-9, 9), st.sampled_from(["", "5", "50"]),
              st.sampled_from([-16385, -16384, -16383, -16382, -1000, 0, 1000, 131070, 131071, 131072, 200000,
                               1073741822, 1073741823])),
    st.sampled_from(["0e-16384", "0e-16383", "0e1073741823", "0.0e-16383", "100e-16385", "-0", "1E+5"]),
)
json_values = st.recursive(st.one_of(json_strings, json_numbers, st.sampled_from(["true", "null"])),
                           lambda inner: st.one_of(st.lists(inner, max_size=3).map(lambda v: "[" + ", ".join(v) + "]"),
                                                   st.lists(st.tuples(json_strings, inner), max_size=3).map(
                                                       lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}")),
                           max_leaves=6)


@hyp
@given(json_values)
def test_json_refusal_agrees_with_jsonb(pg: psycopg.Connection, text: str) -> None:
    pg.execute("SELECT %s::json", (text,))  # every generated text is valid json
    try:
        pg.execute("SELECT %s::jsonb", (text,))
        refused = False
    except psycopg.errors.DataError:
        refused = True
    assert (json_refusal(text) is not None) == refused, (text[:200], json_refusal(text))
