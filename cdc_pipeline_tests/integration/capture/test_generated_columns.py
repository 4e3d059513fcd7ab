"""STORED generated columns, as users run the pipeline (`drain` and `deliver` processes, a writer, a backfill
beside it): the mirror holds the source's values, and a change and a read of the same row give the same
record. On PostgreSQL 18 the publication carries them (`setup` sets publish_generated_columns on an existing
publication, which `check` reports first) and records hold them; before 18 records leave them out on both
paths and the mirror computes them with the source's expression (docs/explanation/values.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from cdc_pipeline.admin.check import check
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.evolving import (
    Writers,
    appended,
    assert_append_history,
    caught_up,
    mirror_and_append,
    source_records,
    streaming,
)
from cdc_pipeline_tests.helpers import assert_mirrored, wait_until
from cdc_pipeline_tests.pg_versions import selected_majors

# The versions where it differs: the machine's default (15, as 14-17) and 18. Module scope: every test of
# the module is parametrized, so no module-scoped fixture outlives its version (see commit 69b57a5).
MAJORS = [m for m in (15, 18) if m in selected_majors()] or [15]
pytestmark = pytest.mark.parametrize("pg_major", MAJORS, ids=[f"pg{m}" for m in MAJORS], scope="module")

TABLE = """
CREATE TABLE public.g (id integer PRIMARY KEY, a integer NOT NULL,
                       total bigint GENERATED ALWAYS AS (a::bigint * 3 + 1) STORED,
                       b text, label text GENERATED ALWAYS AS (upper(b) || '#' || a) STORED);
INSERT INTO public.g (id, a, b) SELECT g, g, 'r' || g FROM generate_series(1, 200) g;
"""
GENERATED = {"total", "label"}
KEYS = 300


def _step(conn: psycopg.Connection, n: int) -> int:
    key = n % KEYS
    if n % 4 == 3:
        return conn.execute("DELETE FROM public.g WHERE id = %s", (key,)).rowcount
    return conn.execute("INSERT INTO public.g (id, a, b) VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                        "SET a = g.a + 1, b = excluded.b", (key, n, f"w{n}")).rowcount


def test_generated_columns_through_changes_and_reads(
        pg_major: int, source_db: Database, db_factory: Callable[[], Database],
        write_config: Callable[..., PipelineConfig], tmp_path: Path) -> None:
    dest = db_factory()
    source_db.execute(TABLE)
    config = write_config(mirror_and_append(source_db.dsn, dest.dsn, "public.g", "out.g"))
    carried = pg_major >= 18
    if carried:  # an existing publication without the option: `check` says so, `setup` sets it
        source_db.execute("CREATE PUBLICATION cdc_test FOR TABLE public.g")
        assert any(f.level == "todo" and "publish_generated_columns" in f.message
                   for f in check(config, sinks=False))
    setup(config)
    if carried:
        assert source_db.execute("SELECT pubgencols FROM pg_publication WHERE pubname = 'cdc_test'") == [("s",)]
        assert not any("publish_generated_columns" in f.message for f in check(config, sinks=False))
    with streaming(tmp_path, config) as pipeline, Writers(source_db.dsn, _step, count=1) as writers:
        wait_until(lambda: writers.changes > 100, 60, "the writer to get going")
        pipeline.run("backfill", "public.g", timeout=120)
        wait_until(lambda: writers.changes > 250, 60, "more changes after the backfill")
        # A generated column added while the writer goes on: on 18 the source rewrote the rows without
        # decoding them (the drain reads the table again); before 18 the mirror computes it.
        source_db.execute("ALTER TABLE public.g ADD COLUMN m7 integer GENERATED ALWAYS AS (a % 7) STORED")
        wait_until(lambda: writers.changes > 400, 60, "more changes after the ALTER TABLE")
        writers.stop()
        want = int(source_db.execute("SELECT count(*) FROM public.g")[0][0])
        pipeline.stop_when(lambda: caught_up(config, source_db.dsn, dest.dsn, "public.g", "id"))
    # The mirror holds the source's values, and its columns' types (computed by it before 18).
    assert assert_mirrored(source_db.dsn, "public.g", dest.dsn, "mirror.g", order="id") == want
    kinds = dict(dest.execute("SELECT attname, attgenerated FROM pg_attribute WHERE attrelid = 'mirror.g'::regclass "
                              "AND attnum > 0 AND NOT attisdropped"))
    assert {c for c, g in kinds.items() if g} == (set() if carried else GENERATED | {"m7"})
    # A change and a read of the same row give the same record: every record holds the same columns (m7
    # from its ALTER TABLE on), and the append sink's history replayed gives the source's rows as records
    # hold them.
    held = {"id", "a", "b"} | (GENERATED if carried else set())
    messages = appended(dest.dsn, "out.g")
    assert {m["action"] for m in messages} >= {"read", "insert", "update", "delete"}
    shapes = [set(m["record"]) for m in messages if m["action"] != "delete"]
    after = shapes.index(held | {"m7"}) if carried else len(shapes)
    assert all(s == held for s in shapes[:after]) and all(s == held | {"m7"} for s in shapes[after:]), shapes
    held |= {"m7"} if carried else set()
    records = [{k: v for k, v in r.items() if k in held} for r in source_records(source_db.dsn, "public.g")]
    assert_append_history(dest.dsn, "out.g", ("id",), records, changes=writers.changes)
