"""Schema changes followed at their position in the stream (the event trigger `setup` installs): the mirror
ends equal to the source row by row and type by type after every kind of ALTER TABLE, with changes before
and after each (in the same transaction too); forged DDL messages change nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, sql

from cdc_pipeline.admin.check import check
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.admin.status import collect
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.evolving import Writers, caught_up, logs, mirror_and_append, streaming
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, sync, wait_until

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


@pytest.mark.pg_matrix
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


def _writer_step(conn: psycopg.Connection, n: int) -> int:
    """Changes that name only the columns no schema change touches (id, v)."""
    key = n % 300
    if n % 4 == 3:
        return conn.execute("DELETE FROM public.w WHERE id = %s", (key,)).rowcount
    return conn.execute("INSERT INTO public.w (id, v) VALUES (%s, 0) ON CONFLICT (id) DO UPDATE SET v = w.v + 1",
                        (key,)).rowcount


def test_schema_changes_under_writers_as_processes(source_db: Database, db_factory: Callable[[], Database],
                                                   write_config: Callable[..., PipelineConfig],
                                                   tmp_path: Path) -> None:
    """`drain` and `deliver` run as users run them while writers go on and the schema changes under them."""
    dest = db_factory()
    source_db.execute("CREATE TABLE public.w (id integer PRIMARY KEY, v integer NOT NULL, n integer DEFAULT 1, "
                      "m numeric(8,2) DEFAULT 1.25, old_name text DEFAULT 'o')")
    config = write_config(mirror_and_append(source_db.dsn, dest.dsn, "public.w", "out.w", batch_size=200))
    setup(config)
    with streaming(tmp_path, config) as pipeline, Writers(source_db.dsn, _writer_step) as writers:
        for ddl in ("ALTER TABLE public.w ADD COLUMN d text DEFAULT 'dflt'",
                    "ALTER TABLE public.w RENAME COLUMN old_name TO new_name",
                    "ALTER TABLE public.w ALTER COLUMN n TYPE bigint",
                    "ALTER TABLE public.w ALTER COLUMN m TYPE numeric(12,4)"):
            seen = writers.changes
            wait_until(lambda seen=seen: writers.changes > seen + 150, 60, "changes between schema changes")
            source_db.execute(ddl)
        source_db.execute("UPDATE public.w SET n = 3000000000 + id, m = 1.2345 WHERE id % 5 = 0")
        wait_until(lambda: writers.changes > seen + 300, 60, "changes after the last schema change")
        writers.stop()
        extra = int(source_db.execute("SELECT count(*) FROM public.w WHERE id % 5 = 0")[0][0])
        pipeline.stop_when(lambda: caught_up(config, source_db.dsn, dest.dsn, "public.w", "id"))
    assert _types(dest.dsn, "mirror.w") == _types(source_db.dsn, "public.w")
    assert_mirrored(source_db.dsn, "public.w", dest.dsn, "mirror.w", order="id")
    rows = dest.execute("SELECT idempotency_key, message->'record'->>'id', commit_lsn, commit_idx, delivered_at "
                        "FROM out.w")
    assert len(rows) == len({r[0] for r in rows}) == writers.changes + extra  # every change once, no schema row
    for key in {r[1] for r in rows}:
        seen_order = [(r[2], r[3]) for r in sorted((r for r in rows if r[1] == key), key=lambda r: (r[4], r[2], r[3]))]
        assert seen_order == sorted(seen_order), f"key {key} went backwards on the append sink"


def test_schema_changes_while_a_backfill_of_the_table_runs(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig],
        tmp_path: Path) -> None:
    """ADD COLUMN with a default, RENAME (in a transaction with changes before and after it) and a TYPE change
    land between the pages of a backfill of the same table, under a writer: the mirror ends equal to the
    source row by row and type by type; the append sink holds every change once, per key in order."""
    dest = db_factory()
    source_db.execute("CREATE TABLE public.w (id integer PRIMARY KEY, v integer NOT NULL, n integer DEFAULT 1, "
                      "m numeric(8,2) DEFAULT 1.25, old_name text DEFAULT 'o'); "
                      "INSERT INTO public.w (id, v, old_name) SELECT g, 0, 'kept' || g FROM generate_series(1, 400) g")
    data = mirror_and_append(source_db.dsn, dest.dsn, "public.w", "out.w", batch_size=200)
    data["backfill"] = {"initial_page_size": 20, "max_page_size": 20}  # 20 pages: the DDL lands between them
    config = write_config(data)
    setup(config)
    def pages() -> int:
        found = source_db.execute("SELECT coalesce(max(pages), 0) FROM cdc_pipeline.backfills")
        return int(found[0][0])

    with streaming(tmp_path, config) as pipeline, Writers(source_db.dsn, _writer_step, count=1) as writers:
        backfill = pipeline.start("--config", pipeline.path, "backfill", "public.w")
        updated = 0  # change messages of the statements below
        with source_db.connect() as conn:
            for after, statements in ((2, ["ALTER TABLE public.w ADD COLUMN d text DEFAULT 'dflt'"]),
                                      (5, ["UPDATE public.w SET old_name = 'before' WHERE id = 3",
                                           "ALTER TABLE public.w RENAME COLUMN old_name TO new_name",
                                           "UPDATE public.w SET new_name = 'after' WHERE id = 4"]),
                                      (8, ["ALTER TABLE public.w ALTER COLUMN n TYPE bigint",
                                           "UPDATE public.w SET n = 3000000000 + id WHERE id % 7 = 0"])):
                wait_until(lambda after=after: pages() >= after, 120, f"page {after} of the backfill")
                with conn.transaction():
                    for statement in statements:
                        updated += max(conn.execute(statement).rowcount, 0)
        assert pages() < 20, "the backfill ended before the schema changes: make its pages smaller"
        assert backfill.wait(180) == 0, logs(tmp_path)
        writers.stop()
        pipeline.stop_when(lambda: caught_up(config, source_db.dsn, dest.dsn, "public.w", "id"))
    assert _types(dest.dsn, "mirror.w") == _types(source_db.dsn, "public.w")
    assert assert_mirrored(source_db.dsn, "public.w", dest.dsn, "mirror.w", order="id") >= 300
    rows = dest.execute("SELECT idempotency_key, message->'record'->>'id', commit_lsn, commit_idx, delivered_at, "
                        "message->>'action' FROM out.w")
    assert len(rows) == len({r[0] for r in rows})  # every message once
    assert sum(1 for r in rows if r[5] != "read") == writers.changes + updated  # every change, no schema row
    for key in {r[1] for r in rows}:
        seen_order = [(r[2], r[3]) for r in sorted((r for r in rows if r[1] == key), key=lambda r: (r[4], r[2], r[3]))]
        assert seen_order == sorted(seen_order), f"key {key} went backwards on the append sink"


def test_catalog_mode_as_a_role_without_event_trigger_rights(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig],
        spark: Any) -> None:
    """A role that may replicate and owns its table but is no superuser: `setup` installs no event trigger,
    `check` says catalog mode and what it cannot see, and ADD (with a default: read again) and DROP columns
    still reach the mirror exactly, type by type, with changes before and after each."""
    dest = db_factory()
    role = f"cdc_catalog_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    source_db.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw' NOSUPERUSER REPLICATION; "
                              "GRANT CREATE ON DATABASE {} TO {}; GRANT CREATE ON SCHEMA public TO {}").format(
        ident, sql.Identifier(source_db.name), ident, ident).as_string())
    try:
        dsn = conninfo.make_conninfo(source_db.dsn, user=role, password="pw")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.c (id integer PRIMARY KEY, a text, gone integer)")
        config = write_config(mirror_config(dsn, dest.dsn, ["public.c"]))
        setup(config)
        finding = next(f for f in check(config, sinks=False) if f.subject == "schema changes")
        assert finding.level == "warning" and "catalog mode" in finding.message and "rename" in finding.message
        assert source_db.execute("SELECT count(*) FROM pg_event_trigger") == [(0,)]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO public.c SELECT g, 'a' || g, g FROM generate_series(1, 20) g")
            sync(config, spark)
            conn.execute("UPDATE public.c SET a = 'before' WHERE id = 1")
            conn.execute("ALTER TABLE public.c ADD COLUMN d integer DEFAULT 42")
            conn.execute("INSERT INTO public.c (id, a, gone, d) VALUES (21, 'new', 0, 7)")
            conn.execute("ALTER TABLE public.c DROP COLUMN gone")
            conn.execute("UPDATE public.c SET a = 'after' WHERE id = 2")

        def followed() -> bool:  # the re-read of the added column may take more than one drain session
            sync(config, spark)
            try:
                return _types(dest.dsn, "mirror.c") == _types(source_db.dsn, "public.c") and assert_mirrored(
                    source_db.dsn, "public.c", dest.dsn, "mirror.c", order="id") == 21
            except AssertionError:
                return False

        wait_until(followed, 120, "the mirror to follow")
        summaries = [r[0] for r in source_db.execute("SELECT record->>'summary' FROM cdc_pipeline.change_log "
                                                     "WHERE action = 'schema' ORDER BY commit_lsn, commit_idx")]
        assert summaries == ["ADD COLUMN d integer", "DROP COLUMN gone"], summaries
    finally:
        source_db.execute(sql.SQL("DROP OWNED BY {}").format(ident).as_string())
        source_db.execute(sql.SQL("DROP ROLE {}").format(ident).as_string())
