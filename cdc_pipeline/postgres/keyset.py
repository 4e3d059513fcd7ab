"""Keyset-pagination queries for backfills (pure: builds SQL, never executes it).

Every identifier goes through ``sql.Identifier`` and every value is a ``%s`` parameter, so table,
column and cursor values coming from config or from the table itself cannot inject SQL. A ``%`` in
an identifier is doubled first: psycopg does not escape it inside ``sql.Identifier`` (psycopg2
issue #825), so ``"win%"`` would break the placeholder parse and ``"a%sb"`` would count as a
placeholder. psycopg turns ``%%`` back into ``%`` whenever parameters are given, so always execute
these queries with the returned list, even when it is empty: ``cur.execute(query, params)``.

A page is ``SELECT cols FROM schema.table WHERE <window> ORDER BY k1, k2, ... LIMIT %s`` where the
keyset ``k1, k2, ...`` is the primary key (full backfill) or ``[sort_column, *pk]`` (partial
backfill). The window is the conjunction of, in this order (which is also the parameter order):

* ``lower``: inclusive start, ``(k1, ..., kj) >= (%s, ...)`` on a prefix of the keyset; a one-value
  lower renders as ``k1 >= %s`` (the partial backfill's start position);
* ``upper``: exclusive end on the first key, ``k1 < %s`` (a partition's end);
* ``k1 IS NOT NULL`` when ``sort_nullable`` (see below);
* ``after``: the cursor, the previous page's last row, ``(k1, k2, ...) > (%s, %s, ...)``.

Ordering is ascending only. Postgres compares row constructors lexicographically, which is what
makes ``(k1, k2) > (v1, v2)`` an exact "strictly after this row" for a unique keyset, and a btree
index on the keyset (or a prefix of it) can serve it as an index condition.

NULLs in the sort column: rows whose sort column is NULL are never returned by a partial backfill.
``NULL >= x``, ``NULL < x`` and a row comparison meeting a NULL are all unknown, so the lower bound
and the cursor already exclude them; with ``sort_nullable=True`` an explicit ``k1 IS NOT NULL``
excludes them from the first pages too (otherwise, with no lower bound, ``ORDER BY`` puts them
last, and a page ending on one would leave a NULL cursor, which :func:`page_query` rejects). Pass ``sort_nullable=True``
whenever the sort column is nullable, so pages and ``count_query`` agree on what the window holds.
Primary-key columns are never NULL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from psycopg import sql

from cdc_pipeline.postgres.compose import escape_percent

DEFAULT_SCHEMA = "public"


def page_query(
    schema: str,
    table: str,
    columns: Sequence[str] | None,
    order_by: Sequence[str],
    after: Sequence[object] | None,
    limit: int,
    lower: Sequence[object] | None = None,
    upper: object | None = None,
    sort_nullable: bool = False,
) -> tuple[sql.Composed, list[object]]:
    """One keyset page and its parameters (lower..., upper, after..., limit).

    ``columns`` None selects ``*``. ``after`` must hold one value per ``order_by`` column (the last
    row's keyset values); ``lower`` one value per leading ``order_by`` column, at least one.
    ``upper`` None means unbounded. NULL is not a valid bound or cursor value (nothing compares
    greater than NULL), so None inside ``after``/``lower`` raises ValueError.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    keys = _identifiers(order_by, "order_by")
    if columns is None:
        select_list: sql.Composable = sql.SQL("*")
    else:
        select_list = sql.SQL(", ").join(_identifiers(columns, "columns"))
    where, params = _window(keys, after, lower, upper, sort_nullable)
    query = sql.SQL(" ").join(
        [
            sql.SQL("SELECT {} FROM {}").format(select_list, _relation(schema, table)),
            *where,
            sql.SQL("ORDER BY {} LIMIT {}").format(sql.SQL(", ").join(keys), sql.Placeholder()),
        ]
    )
    return query, [*params, limit]


def count_query(
    schema: str,
    table: str,
    order_by: Sequence[str],
    after: Sequence[object] | None = None,
    lower: Sequence[object] | None = None,
    upper: object | None = None,
    sort_nullable: bool = False,
) -> tuple[sql.Composed, list[object]]:
    """``SELECT count(*)`` over the same window as :func:`page_query` (without LIMIT), for progress.

    With ``after`` it counts the rows still to come; without, the whole window. Parameters are in
    the same order as :func:`page_query`'s, minus the limit. It reads every row of the window, so
    on a big table run it once per backfill (or use ``pg_class.reltuples`` instead).
    """
    keys = _identifiers(order_by, "order_by")
    where, params = _window(keys, after, lower, upper, sort_nullable)
    query = sql.SQL(" ").join([sql.SQL("SELECT count(*) FROM {}").format(_relation(schema, table)), *where])
    return query, params


def _window(
    keys: list[sql.Identifier],
    after: Sequence[object] | None,
    lower: Sequence[object] | None,
    upper: object | None,
    sort_nullable: bool,
) -> tuple[list[sql.Composable], list[object]]:
    """The WHERE clause (empty list when unbounded) and its parameters, in placeholder order."""
    conditions: list[sql.Composable] = []
    params: list[object] = []
    if lower is not None:
        values = _values(lower, "lower")
        if not 1 <= len(values) <= len(keys):
            raise ValueError(f"lower needs 1 to {len(keys)} values (a keyset prefix), got {len(values)}")
        conditions.append(_compare(keys[: len(values)], ">="))
        params.extend(values)
    if upper is not None:
        conditions.append(_compare(keys[:1], "<"))
        params.append(upper)
    if sort_nullable:
        conditions.append(sql.SQL("{} IS NOT NULL").format(keys[0]))
    if after is not None:
        values = _values(after, "after")
        if len(values) != len(keys):
            raise ValueError(f"after needs one value per order_by column ({len(keys)}), got {len(values)}")
        conditions.append(_compare(keys, ">"))
        params.extend(values)
    if not conditions:
        return [], params
    return [sql.SQL("WHERE ") + sql.SQL(" AND ").join(conditions)], params


def _compare(keys: list[sql.Identifier], op: Literal[">", ">=", "<"]) -> sql.Composed:
    if len(keys) == 1:
        return sql.SQL("{} " + op + " {}").format(keys[0], sql.Placeholder())
    return sql.SQL("({}) " + op + " ({})").format(
        sql.SQL(", ").join(keys), sql.SQL(", ").join([sql.Placeholder()] * len(keys))
    )


def _relation(schema: str, table: str) -> sql.Identifier:
    _check_name(schema, "schema")
    _check_name(table, "table")
    return sql.Identifier(escape_percent(schema), escape_percent(table))


def _identifiers(names: Sequence[str], what: str) -> list[sql.Identifier]:
    # A bare str is a Sequence[str] too; iterating it would turn "id" into columns "i", "d".
    if isinstance(names, str):
        raise TypeError(f"{what} must be a sequence of column names, not a string")
    names = list(names)
    if not names:
        raise ValueError(f"{what} must name at least one column")
    for name in names:
        _check_name(name, what)
    return [sql.Identifier(escape_percent(name)) for name in names]


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"{what}: invalid identifier {name!r}")


def _values(values: Sequence[object], what: str) -> list[object]:
    if isinstance(values, str | bytes):
        raise TypeError(f"{what} must be a sequence of values, not {type(values).__name__}")
    values = list(values)
    if any(value is None for value in values):
        raise ValueError(f"{what} cannot contain NULL (None): nothing compares greater than NULL")
    return values


# Postgres' unquoted identifier: a letter, underscore or non-ASCII char, then also digits and '$'.
_UNQUOTED = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")
_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def parse_qualified(name: str) -> tuple[str, str]:
    """``"schema.table"`` -> ``(schema, table)``, with Postgres' rules for names.

    The schema defaults to ``public``. Double-quoted parts keep their case and may contain dots,
    spaces and doubled quotes (``"my.schema"."T"`` -> ``('my.schema', 'T')``, ``"a""b"`` is
    ``a"b``); unquoted parts are folded to lower case as Postgres does (``Public.Orders`` is
    ``public.orders``). Raises ValueError for anything Postgres would not parse as a one- or
    two-part name.
    """
    parts: list[str] = []
    i, n = 0, len(name)
    while True:
        i = _skip_spaces(name, i)
        if i < n and name[i] == '"':
            part, i = _quoted(name, i)
        else:
            match = _UNQUOTED.match(name, i)
            if match is None:
                raise ValueError(f"invalid qualified name {name!r}: expected an identifier at offset {i}")
            part, i = match.group().translate(_FOLD), match.end()
        parts.append(part)
        i = _skip_spaces(name, i)
        if i == n:
            break
        if name[i] != ".":
            raise ValueError(f"invalid qualified name {name!r}: unexpected {name[i]!r} at offset {i}")
        i += 1
    if len(parts) == 1:
        return DEFAULT_SCHEMA, parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"invalid qualified name {name!r}: expected table or schema.table")


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _quoted(text: str, start: int) -> tuple[str, int]:
    """The delimited identifier opening at ``text[start] == '"'`` and the offset after it."""
    chunks: list[str] = []
    i = start + 1
    while True:
        end = text.find('"', i)
        if end < 0:
            raise ValueError(f"invalid qualified name {text!r}: unterminated quoted identifier")
        chunks.append(text[i:end])
        if text.startswith('""', end):  # an escaped quote inside the identifier
            chunks.append('"')
            i = end + 2
            continue
        value = "".join(chunks)
        if not value:
            raise ValueError(f"invalid qualified name {text!r}: zero-length quoted identifier")
        return value, end + 1
