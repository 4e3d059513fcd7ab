"""A mirror in another encoding (LATIN1): every path keeps the characters (typed reads relayed as COPY
bytes, reads message by message, changes), and what LATIN1 cannot hold fails as that message only."""

from __future__ import annotations

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline_tests.helpers import deliver, drain
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill, backfill_config

LATIN1_TEXT = ["café crème", "naïve Ærø ß ÿ", "plain", "tab\tand \\ backslash"]


def test_a_latin1_mirror_keeps_characters_and_parks_what_it_cannot_hold(db_factory, write_config, spark):
    source, dest = db_factory(), db_factory("LATIN1")
    source.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    with source.connect() as conn:
        for i, text in enumerate(LATIN1_TEXT, 1):
            conn.execute("INSERT INTO t VALUES (%s, %s)", (i, text))
        conn.execute("INSERT INTO t VALUES (9, 'price: 9 €')")  # a typed read the mirror cannot hold
    config = write_config(backfill_config(source.dsn, dest.dsn, ["public.t"],
                                          backoff={"initial_ms": 600_000, "max_ms": 600_000, "jitter": 0}))
    setup(config)
    backfill(config, "public.t")  # typed reads: the relayed run is rejected, then message by message
    stats = deliver(config, spark)
    assert (stats.delivered, stats.parked) == (4, 1)
    with psycopg.connect(dest.dsn) as conn:
        assert conn.execute("SHOW server_encoding").fetchone() == ("LATIN1",)
    assert dest.execute("SELECT id, v FROM mirror.t ORDER BY id") == list(enumerate(LATIN1_TEXT, 1))

    # Values LATIN1 cannot hold, in changes and a typed read: those messages are parked, the rest lands.
    source.execute("INSERT INTO t VALUES (5, '5 € euro')")
    backfill(config, "public.t")
    source.execute("INSERT INTO t VALUES (6, 'über'), (7, 'Ω'); UPDATE t SET v = 'crème brûlée' WHERE id = 1")
    drain(config)
    stats = deliver(config, spark)
    expected = [(i, v) for i, v in source.execute("SELECT id, v FROM t ORDER BY id") if i not in (5, 7, 9)]
    assert dest.execute("SELECT id, v FROM mirror.t ORDER BY id") == expected
    with psycopg.connect(config.state_dsn) as conn:
        parked = conn.execute("SELECT l.pk, f.last_error FROM cdc_pipeline.failed_messages f "
                              "JOIN cdc_pipeline.change_log l USING (commit_lsn, commit_idx) ORDER BY l.pk").fetchall()
    # Row 5's insert fails, its read from the second backfill is held behind it; row 7's insert fails.
    # Row 9's read of the first backfill failed; the second's is held behind it.
    assert [pk for pk, _ in parked] == ["[5]", "[5]", "[7]", "[9]", "[9]"] and stats.parked == 4
    assert [e == HELD for _, e in parked] == [False, True, False, False, True], parked
    assert all("LATIN1" in e for _, e in parked if e != HELD), parked
