"""Changes are keyed by the key the table had when they were made, not by today's catalog (issue 9, smaller
items): a drain that lags behind a primary-key change, or behind dropping the key, still logs each change
by its key (the stream's key flags under REPLICA IDENTITY DEFAULT; else the key recorded in the state
schema's `relations` table)."""

from __future__ import annotations

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.relations import choose_key
from cdc_pipeline.postgres.pgoutput import Column, Relation
from cdc_pipeline_tests.helpers import drain, mirror_config


def logged(config) -> list[tuple[str, str]]:
    with psycopg.connect(config.state_dsn) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT action, pk FROM cdc_pipeline.change_log ORDER BY commit_lsn, commit_idx").fetchall()]


def test_choose_key() -> None:
    def rel(identity: str, flagged: set[str]) -> Relation:
        return Relation(1, "public", "t", identity, tuple(Column(int(n in flagged), n, 23, -1) for n in ("a", "b", "c")))

    assert choose_key(rel("d", {"a", "b"}), ("b", "a"), ()) == ("b", "a")  # today's order when it is the same key
    assert choose_key(rel("d", {"a"}), ("c",), ("a",)) == ("a",)  # today's key is a later one
    assert choose_key(rel("f", {"a", "b", "c"}), (), ("b",)) == ("b",)  # no key today: the recorded one
    assert choose_key(rel("f", {"a", "b", "c"}), ("a",), ("b",)) == ("a",)
    assert choose_key(rel("f", {"a", "b", "c"}), (), ()) == ()


def test_a_lagging_drain_keys_changes_by_the_key_of_their_time(source_db, db_factory, write_config) -> None:
    source_db.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text NOT NULL);"
                      "CREATE TABLE public.f (id int PRIMARY KEY, v text NOT NULL);"
                      "ALTER TABLE public.f REPLICA IDENTITY FULL")
    config = write_config(mirror_config(source_db.dsn, db_factory().dsn, ["public.t", "public.f"]))
    setup(config)
    source_db.execute("INSERT INTO t VALUES (1, 'a'); INSERT INTO f VALUES (1, 'a')")
    drain(config)  # the drain has seen both tables and recorded their keys
    # While no drain runs: changes, then the key changes (t) or goes away (f).
    source_db.execute("INSERT INTO t VALUES (2, 'b'); UPDATE t SET v = 'c' WHERE id = 1")
    source_db.execute("ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (v)")
    source_db.execute("UPDATE f SET v = 'b' WHERE id = 1; DELETE FROM f WHERE id = 1")
    source_db.execute("ALTER TABLE f DROP CONSTRAINT f_pkey")
    drain(config)
    assert logged(config) == [("insert", "[1]"), ("insert", "[1]"),  # before: t, f
                              ("insert", "[2]"), ("update", "[1]"),  # t by id, not by today's key (v)
                              ("update", "[1]"), ("delete", "[1]")]  # f by its recorded key, not all columns


def test_a_backfill_of_a_table_keyed_by_odd_names_is_reconciled(source_db, db_factory, write_config) -> None:
    """Key columns named with '%' or quotes reach the reconciler's SQL as values, never as SQL text
    (issue 15.1: it crashed the drain at every high watermark of such a table)."""
    from cdc_pipeline_tests.integration.backfill.test_backfill import backfill, backfill_config, log_reads

    source_db.execute('CREATE TABLE public.odd ("pct%" int, "a\'b" text, v text, PRIMARY KEY ("pct%", "a\'b"))')
    source_db.execute("INSERT INTO public.odd SELECT g, 'k' || g, 'v' FROM generate_series(1, 30) g")
    config = write_config(backfill_config(source_db.dsn, db_factory().dsn, ["public.odd"],
                                          {"initial_page_size": 10, "max_page_size": 10}))
    setup(config)
    source_db.execute("""UPDATE public.odd SET "pct%" = 100 WHERE "pct%" = 1""")  # a key change in the log
    result = backfill(config, "public.odd")
    assert result.status == "completed" and result.rows_read == 30
    assert sorted(log_reads(config)) == sorted(f'[{100 if g == 1 else g}, "k{g}"]' for g in range(1, 31))


def test_identity_changed_after_setup_is_logged_loudly(source_db, db_factory, write_config, caplog) -> None:
    """`check` and `setup` refuse a replica identity that leaves the key out of deletes; if it is changed
    after setup, the drain says so (with the fix) as soon as it sees the table."""
    import logging

    source_db.execute("CREATE TABLE public.u (id int PRIMARY KEY, code text NOT NULL UNIQUE)")
    config = write_config(mirror_config(source_db.dsn, db_factory().dsn, ["public.u"]))
    setup(config)
    source_db.execute("ALTER TABLE u REPLICA IDENTITY USING INDEX u_code_key")
    source_db.execute("INSERT INTO u VALUES (1, 'a'); DELETE FROM u")
    with caplog.at_level(logging.WARNING, logger="cdc_pipeline.capture.relations"):
        drain(config)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "cdc_pipeline.capture.relations"]
    assert "public.u" in warning and "USING INDEX" in warning and "REPLICA IDENTITY DEFAULT" in warning
