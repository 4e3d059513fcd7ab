"""Schema changes followed at their position in the stream (the event trigger `setup` installs): the mirror
ends equal to the source row by row and type by type after every kind of ALTER TABLE, with changes before
and after each (in the same transaction too); forged DDL messages change nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from cdc_pipeline.admin.check import check
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.admin.status import collect
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, sync

TABLE = """
CREATE TABLE public.s (id integer PRIMARY KEY, a text, n integer, v varchar(10), m numeric(8,2), old_name text,
                       gone integer);
"""
ROWS = """
INSERT INTO public.s SELECT g, 'a' || g, g, 'v' || g, g + 0.25, 'kept' || g, g FROM generate_series(1, 50) g;
"""

STEPS = [
    "ALTER TABLE public.s ADD COLUMN d text DEFAULT 'dflt'",
    "ALTER TABLE public.s ADD COLUMN k integer NOT NULL DEFAULT 42",
    "ALTER TABLE public.s RENAME COLUMN old_name TO new_name",
    "ALTER TABLE public.s ALTER COLUMN n TYPE bigint",
    "ALTER TABLE public.s ALTER COLUMN v TYPE text",
    "ALTER TABLE public.s ALTER COLUMN m TYPE numeric(12,4)",
    "ALTER TABLE public.s DROP COLUMN gone",
    "ALTER TABLE public.s ALTER COLUMN a SET NOT NULL",
    "ALTER TABLE public.s ALTER COLUMN a SET DEFAULT 'z'",
    "ALTER TABLE public.s ADD COLUMN r double precision DEFAULT random()",  # volatile: rows read again
]


def _types(dsn: str, table: str) -> dict[str, str]:
    schema, name = table.split(".")
    with psycopg.connect(dsn) as conn:
        return {r[0]: r[1] for r in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
            "to_regclass(format('%%I.%%I', %s::text, %s::text)) AND attnum > 0 AND NOT attisdropped",
            (schema, name)).fetchall()}


def _write(conn: psycopg.Connection, step: int) -> None:
    """Changes that use the columns in force: an insert, an update, a delete."""
    types = _types(conn.info.dsn, "public.s")
    cols = list(types)
    # Values only the new type holds, once it is in force.
    values: dict[str, Any] = {"id": 1000 + step, "a": f"ins{step}", "n": 3_000_000_000 if types["n"] == "bigint" else 7,
                              "v": "x" * (30 if types["v"] == "text" else 5),
                              "m": 1.2345 if types["m"] == "numeric(12,4)" else 1.5,
                              "new_name": f"nn{step}", "old_name": f"on{step}", "d": f"d{step}", "k": step, "gone": 1}
    use = [c for c in cols if c in values]
    conn.execute(f"INSERT INTO public.s ({', '.join(use)}) VALUES ({', '.join(['%s'] * len(use))})",  # noqa: S608
                 [values[c] for c in use])
    conn.execute("UPDATE public.s SET a = a || '+' WHERE id = %s", (step + 1,))
    conn.execute("DELETE FROM public.s WHERE id = %s", (40 + step,))


def test_every_alter_table_is_followed(source_db: Database, db_factory: Callable[[], Database],
                                       write_config: Callable[..., PipelineConfig], spark: Any) -> None:
    dest = db_factory()
    source_db.execute(TABLE)
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.s"]))
    setup(config)
    assert any(f.subject == "schema changes" and "event trigger" in f.message for f in check(config, sinks=False))
    source_db.execute(ROWS)
    with source_db.connect() as conn:
        for i, ddl in enumerate(STEPS):
            if i % 2:  # DDL inside a transaction with changes before and after it
                with conn.transaction():
                    _write(conn, 2 * i)
                    conn.execute(ddl)
                    _write(conn, 2 * i + 1)
            else:
                conn.execute(ddl)
                _write(conn, 2 * i)
            if i in (2, 6):
                sync(config, spark)  # some steps reach the mirror alone, others several in one batch
    sync(config, spark)
    sync(config, spark)  # the re-read after the volatile default
    assert _types(dest.dsn, "mirror.s") == _types(source_db.dsn, "public.s")
    assert assert_mirrored(source_db.dsn, "public.s", dest.dsn, "mirror.s", order="id") > 50
    last = collect(config)["schema_changes"]["public.s"]
    assert "ADD COLUMN r double precision" in last["summary"] and "ADD COLUMN r" in last["reread"]
    # The change log keeps the history: one `schema` row per statement, at its position.
    assert source_db.execute("SELECT count(*) FROM cdc_pipeline.change_log WHERE action = 'schema'") == [(len(STEPS),)]


def test_forged_ddl_messages_change_nothing(source_db: Database, db_factory: Callable[[], Database],
                                            write_config: Callable[..., PipelineConfig], spark: Any) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.f (id integer PRIMARY KEY, a text)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.f"]))
    setup(config)
    source_db.execute("INSERT INTO public.f VALUES (1, 'one')")
    sync(config, spark)
    shape = ('{"table": "public.f", "columns": [{"attnum": 1, "name": "id", "type": "integer"}, '
             '{"attnum": 2, "name": "%s", "type": "integer"}]}')
    body = ('{"v": 1, "publication": "cdc_test", "relid": 1, "tag": "ALTER TABLE", "before": ' + shape % "a"
            + ', "after": ' + shape % "b" + '}')
    with source_db.connect() as conn:
        for content in ("0" * 64 + body, body, "x", ""):  # a made-up signature, none, garbage, empty
            with conn.transaction():
                conn.execute("SELECT pg_logical_emit_message(true, 'cdc_pipeline.ddl', %s)", (content,))
                conn.execute("INSERT INTO public.f VALUES (2 + %s, 'more')", (len(content),))
    sync(config, spark)
    assert _types(dest.dsn, "mirror.f") == {"id": "integer", "a": "text"}
    assert assert_mirrored(source_db.dsn, "public.f", dest.dsn, "mirror.f", order="id") == 5
    assert source_db.execute("SELECT count(*) FROM cdc_pipeline.change_log WHERE action = 'schema'") == [(0,)]
