"""The one place that makes composed SQL safe for psycopg's ``%`` placeholder parser.

psycopg renders a ``sql.Composed`` to text and, when the query has parameters, parses ``%s``/``%%`` in
the *whole* text, including quoted identifiers and literals: a column named ``pct%`` breaks the parse
(``only '%s', '%b', '%t' are allowed``) and one named ``a%sb`` counts as a placeholder. So every
statement that mixes composed names or literals with parameters goes through :func:`execute` (or
:func:`render`), which doubles ``%`` inside identifiers and literals only; psycopg turns ``%%`` back
into ``%``, so the server sees the original names.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.abc import AdaptContext


def escape_percent(name: str) -> str:
    """For names put into templates that are later %-formatted (psycopg or Python ``%``)."""
    return name.replace("%", "%%")


def render(query: sql.Composable | str, context: AdaptContext) -> str:
    """The query text, with ``%`` doubled inside identifiers and literals (placeholders kept)."""
    if isinstance(query, str):
        return query
    if isinstance(query, sql.Composed):
        return "".join(render(part, context) for part in query)
    text = query.as_string(context)
    if isinstance(query, sql.SQL | sql.Placeholder):
        return text
    return escape_percent(text)  # Identifier, Literal: data, never placeholders


def execute(conn: psycopg.Connection[Any] | psycopg.Cursor[Any], query: sql.Composable | str,
            params: Any = None) -> psycopg.Cursor[Any]:
    """``conn.execute(query, params)`` that survives ``%`` in composed names and literals."""
    if params is None:  # no placeholder parse happens: send as composed
        return conn.execute(query)  # type: ignore[arg-type]
    return conn.execute(sql.SQL(render(query, conn)), params)  # type: ignore[arg-type]
