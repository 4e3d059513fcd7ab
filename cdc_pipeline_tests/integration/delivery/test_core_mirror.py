"""Core path against a real PostgreSQL and Spark: slot -> change log -> Spark -> mirror table."""

from __future__ import annotations

import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config, sync

TYPES_DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE public.everything (
  id bigint PRIMARY KEY, i2 smallint, i4 integer, n numeric(20,6), nbig numeric, f4 real, f8 double precision,
  b boolean, t text, vc varchar(20), u uuid, d date, ts timestamp, tstz timestamptz, j json, jb jsonb,
  by bytea, ai integer[], at text[], m mood, iv interval, tm time
);
"""

INSERT_ALL = """
INSERT INTO public.everything VALUES
 (1, 1, -2, 12345678901234.123456, 123456789012345678901234567890.123456789, 1.5, -2.25e100, true, 'hé "q" \\ x',
  'v', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2025-01-02', '2025-01-02 03:04:05.678', '2025-01-02 03:04:05+05:30',
  '{"b": [1, 2], "a": null}', '{"z": 1, "a": {"k": "v"}}', '\\x00ff10', '{1,NULL,3}', '{"a b","c,d",NULL}', 'happy',
  '1 day 02:00:00', '10:11:12'),
 (2, NULL, NULL, NULL, 'NaN', 'NaN', 'Infinity', false, '', NULL, NULL, 'infinity', '-infinity', NULL, 'null', '[]',
  '\\x', '{}', '{}', NULL, NULL, NULL)
"""


@pytest.mark.pg_matrix
def test_every_type_insert_update_delete(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute(TYPES_DDL)
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.everything"]))
    setup(config)
    source_db.execute(INSERT_ALL)
    sync(config, spark)
    assert assert_mirrored(source_db.dsn, "public.everything", dest.dsn, "mirror.everything") == 2

    source_db.execute("UPDATE public.everything SET t = 'changed', ai = '{4,5}', jb = '{\"x\": 2}' WHERE id = 1")
    source_db.execute("UPDATE public.everything SET id = 3 WHERE id = 2")  # key change
    source_db.execute("DELETE FROM public.everything WHERE id = 1")
    sync(config, spark)
    assert assert_mirrored(source_db.dsn, "public.everything", dest.dsn, "mirror.everything") == 1


@pytest.mark.pg_matrix
def test_truncate_nulls_and_multi_table_transaction(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (k text PRIMARY KEY, n int)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.a", "public.b"]))
    setup(config)
    with source_db.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO a SELECT g, CASE WHEN g % 2 = 0 THEN NULL ELSE 'v' || g END FROM generate_series(1, 50) g")
        conn.execute("INSERT INTO b SELECT 'k' || g, g FROM generate_series(1, 20) g")
        conn.execute("UPDATE a SET v = NULL WHERE id = 1")
    source_db.execute("TRUNCATE a")
    source_db.execute("INSERT INTO a VALUES (7, 'after truncate')")
    sync(config, spark)
    assert assert_mirrored(source_db.dsn, "public.a", dest.dsn, "mirror.a") == 1
    assert assert_mirrored(source_db.dsn, "public.b", dest.dsn, "mirror.b") == 20


@pytest.mark.pg_matrix
def test_unchanged_toast_both_replica_identities(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute(
        "CREATE TABLE d (id int PRIMARY KEY, big text, n int);"
        "CREATE TABLE f (id int PRIMARY KEY, big text, n int); ALTER TABLE f REPLICA IDENTITY FULL;"
        "ALTER TABLE d ALTER COLUMN big SET STORAGE EXTERNAL; ALTER TABLE f ALTER COLUMN big SET STORAGE EXTERNAL")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.d", "public.f"]))
    setup(config)
    big = "x" * 100_000
    for t in ("d", "f"):
        source_db.execute(f"INSERT INTO {t} VALUES (1, %s, 0), (2, %s, 0)", (big, big + "y"))
    sync(config, spark)
    # Updates that leave the TOASTed column alone: pgoutput sends it as 'unchanged'.
    for t in ("d", "f"):
        source_db.execute(f"UPDATE {t} SET n = n + 1")
        source_db.execute(f"UPDATE {t} SET n = n + 1 WHERE id = 1")
    sync(config, spark)
    for t in ("d", "f"):
        assert assert_mirrored(source_db.dsn, f"public.{t}", dest.dsn, f"mirror.{t}") == 2
    # Insert and partial update in the same batch: the mirror keeps the inserted value.
    for t in ("d", "f"):
        source_db.execute(f"INSERT INTO {t} VALUES (3, %s, 0)", (big + "z",))
        source_db.execute(f"UPDATE {t} SET n = 5 WHERE id = 3")
    sync(config, spark)
    for t in ("d", "f"):
        assert assert_mirrored(source_db.dsn, f"public.{t}", dest.dsn, f"mirror.{t}") == 3


@pytest.mark.pg_matrix
def test_alter_table_mid_stream(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE s (id int PRIMARY KEY, a text, gone int)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.s"]))
    setup(config)
    source_db.execute("INSERT INTO s VALUES (1, 'one', 1)")
    source_db.execute("ALTER TABLE s ADD COLUMN added numeric DEFAULT 2.5")
    source_db.execute("INSERT INTO s VALUES (2, 'two', 2, 3.5)")
    source_db.execute("ALTER TABLE s DROP COLUMN gone")
    source_db.execute("INSERT INTO s VALUES (3, 'three', 4.5)")
    source_db.execute("UPDATE s SET a = 'uno' WHERE id = 1")
    sync(config, spark)
    # Row 1 was mirrored before the column existed: the mirror gives it the default at the ADD COLUMN's
    # position, as the source does (capture/schema_changes.py).
    assert assert_mirrored(source_db.dsn, "public.s", dest.dsn, "mirror.s") == 3


@pytest.mark.pg_matrix
def test_idle_database_slot_advances_by_heartbeat(source_db, db_factory, write_config):
    from cdc_pipeline.capture.drain import Drain

    dest = db_factory()
    source_db.execute("CREATE TABLE quiet (id int PRIMARY KEY)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.quiet"]))
    setup(config)
    # Unrelated WAL (not in the publication) keeps being written; the slot must still move.
    source_db.execute("CREATE TABLE noise (v text); INSERT INTO noise SELECT repeat('x', 1000) FROM generate_series(1, 2000)")

    def confirmed() -> int:
        return source_db.execute("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots "
                                 "WHERE slot_name = 'cdc_test'")[0][0]

    before = confirmed()
    stats = Drain(config).run(seconds=3)
    assert stats.changes == 0 and stats.heartbeats >= 2
    assert confirmed() > before
    last = source_db.execute("SELECT last_heartbeat_at FROM cdc_pipeline.slot_progress")[0][0]
    assert last is not None


def test_retention_deletes_only_what_every_sink_has_passed(source_db, db_factory, write_config, spark):
    from cdc_pipeline.state import retention

    dest = db_factory()
    source_db.execute("CREATE TABLE r (id int PRIMARY KEY)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.r"]))
    setup(config)
    source_db.execute("INSERT INTO r SELECT generate_series(1, 10)")
    drain(config)
    with source_db.connect() as conn:
        # Nothing delivered yet: the sink still needs everything.
        assert retention.trim_log(conn, "cdc_pipeline", 1e-6, ["mirror"]) == 0
    deliver(config, spark)
    source_db.execute("INSERT INTO r SELECT generate_series(11, 15)")
    drain(config)
    with source_db.connect() as conn:
        assert retention.trim_log(conn, "cdc_pipeline", 1e-6, ["mirror"]) == 10  # the delivered ones only
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.change_log").fetchone() == (5,)
    sync(config, spark)
    assert assert_mirrored(source_db.dsn, "public.r", dest.dsn, "mirror.r") == 15
