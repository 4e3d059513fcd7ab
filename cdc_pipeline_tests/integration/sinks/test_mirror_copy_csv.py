"""The mirror's fast path for typed reads (sinks/postgres/typed.py ``copy_run``): composite texts relayed as
COPY text and COPYed into the mirror table as CSV. Property-based against PostgreSQL's own cast of the same
composite text to the row type, with values made of what CSV, COPY text and record_out each treat specially
(quotes, backslashes, commas, parentheses, braces, blanks, a line holding only the end-of-data marker, NULL
and '') in text, arrays, jsonb and bytea, on every destination version."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_pipeline.postgres import session
from cdc_pipeline.sinks.postgres import typed
from cdc_pipeline_tests.conftest import Database

hyp = settings(database=None, max_examples=60, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

COLUMNS = (("id", "integer"), ("t", "text"), ("a", "text[]"), ("j", "jsonb"), ("b", "bytea"), ("c", "character(4)"))
BODY = ", ".join(f"{c} {t}" for c, t in COLUMNS)

# What any of the three formats treats specially, and a little else.
hostile = st.lists(st.sampled_from(list('\\"\',(){}. \t\r\nxé\x01\x7f') + ["\\.", "\n\\.\n", '""']),
                   max_size=8).map("".join)
values = st.tuples(st.none() | hostile, st.none() | st.lists(st.none() | hostile, max_size=3),
                   st.none() | st.dictionaries(hostile, st.none() | hostile, max_size=2),
                   st.none() | st.binary(max_size=6), st.none() | hostile.map(lambda s: s[:4]))


@pytest.fixture(scope="module")
def pg(pg_dest_server: str) -> Iterator[psycopg.Connection]:
    name = "t_mirror_copy_csv"
    with psycopg.connect(pg_dest_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    with session.connect(Database(pg_dest_server, name).dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE src ({BODY}); CREATE TABLE expected ({BODY}); "
                     f"CREATE TABLE m ({BODY}, PRIMARY KEY (id))")
        yield conn
    with psycopg.connect(pg_dest_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.pg_matrix  # COPY's CSV parsing (its end-of-data marker among others) differs across versions
@hyp
@given(rows=st.lists(values, min_size=1, max_size=6), one_block=st.booleans())
def test_copied_rows_equal_the_cast_of_their_composite_text(pg: psycopg.Connection, rows, one_block: bool) -> None:
    pg.execute("TRUNCATE src, expected, m")
    with pg.cursor() as cur:
        cur.executemany("INSERT INTO src VALUES (%s, %s, %s, %s::jsonb, %s, %s)", [
            (i, t, a, None if j is None else psycopg.types.json.Jsonb(j), b, c)
            for i, (t, a, j, b, c) in enumerate(rows)])
    # What a backfill stages and the relay sends: the row's composite text, as COPY text.
    with pg.cursor().copy("COPY (SELECT ROW(s.*)::text FROM src s ORDER BY id) TO STDOUT") as copy:
        lines = [bytes(d) for d in copy]
    pg.execute("INSERT INTO expected SELECT (ROW(s.*)::text::expected).* FROM src s")
    with pg.transaction():
        written = typed.copy_run(pg, ("public", "m"), COLUMNS, [b"".join(lines)] if one_block else lines)
    assert written == len(rows)
    differ = pg.execute("SELECT (SELECT count(*) FROM (TABLE m EXCEPT ALL TABLE expected) x), "
                        "(SELECT count(*) FROM (TABLE expected EXCEPT ALL TABLE m) y), "
                        "(SELECT count(*) FROM (TABLE src EXCEPT ALL TABLE m) z)").fetchone()
    assert differ == (0, 0, 0)
