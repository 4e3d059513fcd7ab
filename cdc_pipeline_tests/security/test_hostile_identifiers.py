"""Hostile identifiers (issue 15.1): `%` and quotes in column names reach every composed statement."""

from __future__ import annotations

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, sync
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill, backfill_config

DDL = """CREATE TABLE public.pcts ("pct%" int, "a'b" text, "k%s" int, v text, PRIMARY KEY ("pct%", "k%s"))"""


def test_percent_and_quote_columns_mirrored_exactly(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute(DDL)
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ['public.pcts']))
    setup(config)
    source_db.execute("""INSERT INTO pcts VALUES (1, 'x%sy', 1, 'a'), (2, '100%', 2, 'b')""")
    source_db.execute("""UPDATE pcts SET "a'b" = 'it''s 5%' WHERE "pct%" = 1""")
    source_db.execute("""UPDATE pcts SET "pct%" = 3 WHERE "pct%" = 2""")  # key change
    stats = sync(config, spark)
    assert stats.parked == 0
    assert assert_mirrored(source_db.dsn, 'public.pcts', dest.dsn, 'mirror.pcts') == 2
    source_db.execute("""DELETE FROM pcts WHERE "pct%" = 1""")
    sync(config, spark)
    assert assert_mirrored(source_db.dsn, 'public.pcts', dest.dsn, 'mirror.pcts') == 1


def test_percent_columns_backfilled(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute(DDL)
    source_db.execute("""INSERT INTO pcts SELECT g, 'r%' || g, g, 'v' FROM generate_series(1, 40) g""")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ['public.pcts']))
    setup(config)
    progress = backfill(config, 'public.pcts')
    assert progress.rows_read == 40
    stats = sync(config, spark)
    assert stats.parked == 0
    assert assert_mirrored(source_db.dsn, 'public.pcts', dest.dsn, 'mirror.pcts') == 40
