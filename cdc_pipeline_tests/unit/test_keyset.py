"""Keyset page and count queries, and qualified-name parsing. Pure: queries are rendered with
``as_string(None)`` (psycopg >= 3.2 needs no connection for that), never executed."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from cdc_pipeline.postgres.keyset import count_query, page_query, parse_qualified

TS = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
TS2 = dt.datetime(2025, 2, 1, tzinfo=dt.UTC)


def render(query: sql.Composable) -> str:
    return query.as_string(None)


def quoted(name: str) -> str:
    """Reference quoting: what the query text must hold for one identifier."""
    return '"' + name.replace('"', '""').replace("%", "%%") + '"'


def placeholders(text: str) -> int:
    """Placeholders the way psycopg counts them: '%%' is a literal percent, '%s' a parameter."""
    return text.replace("%%", "").count("%s")


# -- page_query: the common shapes, spelled out -------------------------------------------------


def test_full_backfill_first_page() -> None:
    query, params = page_query("public", "orders", None, ["id"], None, 1000)
    assert isinstance(query, sql.Composed)
    assert render(query) == 'SELECT * FROM "public"."orders" ORDER BY "id" LIMIT %s'
    assert params == [1000]


def test_full_backfill_next_page_single_key() -> None:
    query, params = page_query("public", "orders", None, ["id"], [42], 500)
    assert render(query) == 'SELECT * FROM "public"."orders" WHERE "id" > %s ORDER BY "id" LIMIT %s'
    assert params == [42, 500]


def test_composite_key_uses_a_row_comparison() -> None:
    query, params = page_query("app", "line_items", None, ["order_id", "line_no"], [7, 3], 100)
    assert render(query) == (
        'SELECT * FROM "app"."line_items" WHERE ("order_id", "line_no") > (%s, %s) '
        'ORDER BY "order_id", "line_no" LIMIT %s'
    )
    assert params == [7, 3, 100]


def test_selected_columns() -> None:
    query, _ = page_query("public", "orders", ["id", "status", "Total"], ["id"], None, 10)
    assert render(query) == 'SELECT "id", "status", "Total" FROM "public"."orders" ORDER BY "id" LIMIT %s'


def test_partial_backfill_first_page() -> None:
    query, params = page_query("public", "orders", None, ["updated_at", "id"], None, 1000, lower=[TS])
    assert render(query) == (
        'SELECT * FROM "public"."orders" WHERE "updated_at" >= %s ORDER BY "updated_at", "id" LIMIT %s'
    )
    assert params == [TS, 1000]


def test_partial_backfill_window_with_cursor_keeps_parameter_order() -> None:
    query, params = page_query(
        "public", "orders", None, ["updated_at", "id"], [TS, 17], 250, lower=[TS], upper=TS2
    )
    assert render(query) == (
        'SELECT * FROM "public"."orders" WHERE "updated_at" >= %s AND "updated_at" < %s '
        'AND ("updated_at", "id") > (%s, %s) ORDER BY "updated_at", "id" LIMIT %s'
    )
    assert params == [TS, TS2, TS, 17, 250]


def test_lower_may_cover_a_prefix_of_the_keyset() -> None:
    query, params = page_query("public", "orders", None, ["updated_at", "id"], None, 5, lower=[TS, 9])
    assert 'WHERE ("updated_at", "id") >= (%s, %s) ORDER BY' in render(query)
    assert params == [TS, 9, 5]


def test_upper_only() -> None:
    query, params = page_query("public", "orders", None, ["updated_at", "id"], None, 5, upper=TS2)
    assert 'WHERE "updated_at" < %s ORDER BY' in render(query)
    assert params == [TS2, 5]


def test_falsy_bounds_and_cursors_are_still_bounds() -> None:
    # 0, "" and False are values; only None means "no bound".
    query, params = page_query("public", "t", None, ["k"], [0], 5, lower=[""], upper=False)
    assert render(query) == (
        'SELECT * FROM "public"."t" WHERE "k" >= %s AND "k" < %s AND "k" > %s ORDER BY "k" LIMIT %s'
    )
    assert params == ["", False, 0, 5]


def test_sort_nullable_excludes_nulls_explicitly() -> None:
    query, params = page_query("public", "orders", None, ["updated_at", "id"], None, 5, sort_nullable=True)
    assert render(query) == (
        'SELECT * FROM "public"."orders" WHERE "updated_at" IS NOT NULL ORDER BY "updated_at", "id" LIMIT %s'
    )
    assert params == [5]


# -- page_query and count_query: every combination ----------------------------------------------

KEYSETS = [["id"], ["tenant", "id"], ["updated_at", "tenant", "id"]]


def _expected_window(
    keys: Sequence[str],
    after: Sequence[object] | None,
    lower: Sequence[object] | None,
    upper: object | None,
    sort_nullable: bool,
) -> tuple[str, list[object]]:
    def compare(names: Sequence[str], op: str) -> str:
        if len(names) == 1:
            return f"{quoted(names[0])} {op} %s"
        return f"({', '.join(map(quoted, names))}) {op} ({', '.join(['%s'] * len(names))})"

    conditions: list[str] = []
    params: list[object] = []
    if lower is not None:
        conditions.append(compare(keys[: len(lower)], ">="))
        params += lower
    if upper is not None:
        conditions.append(compare(keys[:1], "<"))
        params.append(upper)
    if sort_nullable:
        conditions.append(f"{quoted(keys[0])} IS NOT NULL")
    if after is not None:
        conditions.append(compare(keys, ">"))
        params += after
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), params


@pytest.mark.parametrize(
    ("keys", "with_after", "lower_len", "with_upper", "sort_nullable", "columns"),
    [
        (keys, with_after, lower_len, with_upper, sort_nullable, columns)
        for keys in KEYSETS
        for with_after, lower_len, with_upper, sort_nullable, columns in itertools.product(
            [False, True], sorted({0, 1, len(keys)}), [False, True], [False, True], [None, ["id", "v"]]
        )
    ],
)
def test_every_window_combination(
    keys: list[str],
    with_after: bool,
    lower_len: int,
    with_upper: bool,
    sort_nullable: bool,
    columns: list[str] | None,
) -> None:
    after = [f"after-{k}" for k in keys] if with_after else None
    lower = [f"lower-{k}" for k in keys[:lower_len]] if lower_len else None
    upper = "upper" if with_upper else None

    query, params = page_query("s", "t", columns, keys, after, 77, lower, upper, sort_nullable)
    where, window_params = _expected_window(keys, after, lower, upper, sort_nullable)
    select_list = "*" if columns is None else ", ".join(map(quoted, columns))
    text = render(query)
    assert (
        text == f'SELECT {select_list} FROM "s"."t"{where} ORDER BY {", ".join(map(quoted, keys))} LIMIT %s'
    )
    assert params == [*window_params, 77]
    assert placeholders(text) == len(params)

    count, count_params = count_query("s", "t", keys, after, lower, upper, sort_nullable)
    assert render(count) == f'SELECT count(*) FROM "s"."t"{where}'
    assert count_params == window_params
    assert placeholders(render(count)) == len(count_params)


def test_count_query_defaults_to_the_whole_table() -> None:
    query, params = count_query("public", "orders", ["id"])
    assert render(query) == 'SELECT count(*) FROM "public"."orders"'
    assert params == []


def test_count_query_for_a_partial_backfill_window() -> None:
    query, params = count_query("public", "orders", ["updated_at", "id"], lower=[TS], upper=TS2)
    assert (
        render(query)
        == 'SELECT count(*) FROM "public"."orders" WHERE "updated_at" >= %s AND "updated_at" < %s'
    )
    assert params == [TS, TS2]


# -- identifiers are always quoted, whatever they hold -------------------------------------------

EVIL = 'a"; drop table x; --'


def test_injection_in_every_identifier_position_is_one_quoted_identifier() -> None:
    query, params = page_query(EVIL, EVIL, [EVIL], [EVIL, "id"], [1, 2], 10, lower=[0], upper=9)
    text = render(query)
    q = quoted(EVIL)
    assert q == '"a""; drop table x; --"'
    assert text == (
        f'SELECT {q} FROM {q}.{q} WHERE {q} >= %s AND {q} < %s AND ({q}, "id") > (%s, %s) '
        f'ORDER BY {q}, "id" LIMIT %s'
    )
    assert params == [0, 9, 1, 2, 10]
    # The rendered relation parses back to the original names: one identifier each, nothing more.
    assert parse_qualified(f"{q}.{q}") == (EVIL, EVIL)


@pytest.mark.parametrize(
    "name",
    [
        "my.schema",
        "Mixed Case",
        'quo"te',
        "semi;colon",
        "new\nline",
        "back\\slash",
        "uni\u00e7\u00f8de",
        "it's",
    ],
)
def test_unusual_identifiers_are_quoted_verbatim(name: str) -> None:
    query, _ = page_query(name, name, None, [name], None, 1)
    assert render(query) == f"SELECT * FROM {quoted(name)}.{quoted(name)} ORDER BY {quoted(name)} LIMIT %s"


def test_percent_in_identifiers_does_not_become_a_placeholder() -> None:
    query, params = page_query("public", "win%", ["a%sb"], ["id%"], [1], 5)
    text = render(query)
    assert text == 'SELECT "a%%sb" FROM "public"."win%%" WHERE "id%%" > %s ORDER BY "id%%" LIMIT %s'
    assert placeholders(text) == len(params) == 2


def test_percent_escaping_round_trips_through_psycopg_placeholder_conversion() -> None:
    # Guards the assumption behind the %-doubling against psycopg changing how it parses queries.
    try:
        from psycopg._queries import PostgresQuery
        from psycopg.adapt import Transformer
    except ImportError:  # pragma: no cover - private psycopg API
        pytest.skip("psycopg's private query converter moved")
    for query, params in (
        page_query("public", "win%", ["a%sb"], ["id%"], [1], 5),
        count_query("public", "win%", ["id%"], after=[1]),
        count_query("public", "win%", ["id%"], sort_nullable=True),  # no parameters at all
    ):
        converted = PostgresQuery(Transformer())
        converted.convert(query, params)
        assert converted.query is not None
        text = bytes(converted.query).decode()
        assert '"win%"' in text and '"id%"' in text
        assert "%%" not in text


identifier_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=20
)


@settings(max_examples=200, deadline=None)
@given(schema=identifier_text, table=identifier_text, column=identifier_text)
def test_any_identifier_is_quoted_and_parses_back(schema: str, table: str, column: str) -> None:
    query, params = page_query(schema, table, [column], [column], ["v"], 3)
    text = render(query)
    assert text == (
        f"SELECT {quoted(column)} FROM {quoted(schema)}.{quoted(table)} WHERE {quoted(column)} > %s "
        f"ORDER BY {quoted(column)} LIMIT %s"
    )
    assert placeholders(text) == len(params) == 2
    raw = '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'
    assert parse_qualified(raw) == (schema, table)


# -- argument validation ------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "10", None])
def test_limit_must_be_a_positive_int(limit: object) -> None:
    with pytest.raises(ValueError, match="limit"):
        page_query("public", "t", None, ["id"], None, limit)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"order_by": []}, ValueError),
        ({"order_by": "id"}, TypeError),
        ({"columns": "id"}, TypeError),
        ({"columns": []}, ValueError),
        ({"columns": ["ok", ""]}, ValueError),
        ({"schema": ""}, ValueError),
        ({"table": ""}, ValueError),
        ({"order_by": ["a\x00b"]}, ValueError),
        ({"after": [1]}, ValueError),  # two keys, one value
        ({"after": [1, 2, 3]}, ValueError),
        ({"after": [None, 2]}, ValueError),
        ({"after": "ab"}, TypeError),
        ({"lower": []}, ValueError),
        ({"lower": [1, 2, 3]}, ValueError),
        ({"lower": [None]}, ValueError),
        ({"lower": b"x"}, TypeError),
    ],
)
def test_invalid_arguments(kwargs: dict[str, object], error: type[Exception]) -> None:
    args: dict[str, object] = {
        "schema": "public",
        "table": "t",
        "columns": None,
        "order_by": ["updated_at", "id"],
        "after": None,
        "limit": 10,
    }
    args.update(kwargs)
    with pytest.raises(error):
        page_query(**args)  # type: ignore[arg-type]
    count_args = {k: v for k, v in args.items() if k not in ("columns", "limit")}
    if "columns" not in kwargs:
        with pytest.raises(error):
            count_query(**count_args)  # type: ignore[arg-type]


# -- parse_qualified ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("orders", ("public", "orders")),
        ("public.orders", ("public", "orders")),
        ("Sales.Orders", ("sales", "orders")),  # unquoted names fold to lower case, as in Postgres
        ('"Sales"."Orders"', ("Sales", "Orders")),
        ('"my.schema"."t"', ("my.schema", "t")),
        ('"my.schema".t', ("my.schema", "t")),
        ('analytics."odd.table"', ("analytics", "odd.table")),
        ('"a.b.c"', ("public", "a.b.c")),
        ('"a""b"."c"', ('a"b', "c")),
        ('""""', ("public", '"')),
        ('"with space"."x y"', ("with space", "x y")),
        ('"a""; drop table x; --"', ("public", 'a"; drop table x; --')),
        ("  public . orders  ", ("public", "orders")),
        ("_t$1", ("public", "_t$1")),
        ("caf\u00e9.na\u00efve", ("caf\u00e9", "na\u00efve")),
        ("CAF\u00c9", ("public", "caf\u00c9")),  # only ASCII letters fold
    ],
)
def test_parse_qualified(name: str, expected: tuple[str, str]) -> None:
    assert parse_qualified(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        "",
        "   ",
        ".",
        "a.",
        ".a",
        "a..b",
        "db.schema.table",
        '"unterminated',
        '"a".',
        'a."',
        '""',
        '"".t',
        '"a"b',
        "a b",
        "1abc",
        "a-b",
        "a;drop",
        "a.b;",
        '"a""',
    ],
)
def test_parse_qualified_rejects(name: str) -> None:
    with pytest.raises(ValueError):
        parse_qualified(name)


@settings(max_examples=200, deadline=None)
@given(
    schema=st.from_regex(re.compile(r"[a-z_][a-z0-9_$]{0,15}", re.ASCII), fullmatch=True),
    table=st.from_regex(re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,15}", re.ASCII), fullmatch=True),
)
def test_parse_qualified_unquoted_names(schema: str, table: str) -> None:
    assert parse_qualified(f"{schema}.{table}") == (schema, table.lower())
    assert parse_qualified(table) == ("public", table.lower())
