"""A `json` value holding a NUL escape (valid json, refused by jsonb) neither stalls the drain nor a backfill
(issue 9.7): it is logged with the escape turned into the text `\\u0000`, and every change after it
arrives, in the log and in the mirror."""

from __future__ import annotations

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.json_text import escape_nul
from cdc_pipeline_tests.helpers import deliver, drain, rows
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill, backfill_config, log_reads

NUL = r'{"a": "x\u0000y", "b": [1, "\u0000"], "c": "\\u0000 is not a NUL", "d": "\\\u0000"}'


def test_escape_nul_only_touches_nul_escapes() -> None:
    assert escape_nul(NUL) == r'{"a": "x\\u0000y", "b": [1, "\\u0000"], "c": "\\u0000 is not a NUL", "d": "\\\\u0000"}'
    assert escape_nul(r'["\u00001", "\u0041"]') == r'["\\u00001", "\u0041"]'


def test_a_nul_in_json_is_logged_and_the_changes_after_it_arrive(source_db, db_factory, write_config, spark) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.docs (id int PRIMARY KEY, j json, jb jsonb, n int)")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.docs"]))
    setup(config)
    with source_db.connect() as conn:
        conn.execute("INSERT INTO docs VALUES (1, %s::json, '{\"ok\": true}', 1)", (NUL,))
        conn.execute("INSERT INTO docs SELECT g, json_build_object('g', g), jsonb_build_object('g', g), g "
                     "FROM generate_series(2, 50) g")
        conn.execute("UPDATE docs SET n = n + 100 WHERE id <= 10")  # the NUL row again, and others
        conn.execute("DELETE FROM docs WHERE id = 50")
        conn.execute("INSERT INTO docs VALUES (51, %s::json, NULL, 51)", (NUL,))
    stats = drain(config)
    assert stats.changes == 1 + 49 + 10 + 1 + 1
    with psycopg.connect(config.state_dsn) as conn:
        logged = conn.execute("SELECT pk, action, record->'j' FROM cdc_pipeline.change_log "
                              "ORDER BY commit_lsn, commit_idx").fetchall()
        # the slot moved past everything: a restarted drain has nothing to replay
        committed = conn.execute("SELECT committed_lsn FROM cdc_pipeline.slot_progress").fetchone()
    assert len(logged) == 62 and logged[-1][:2] == ("[51]", "insert")
    escaped = {"a": "x\\u0000y", "b": [1, "\\u0000"], "c": "\\u0000 is not a NUL", "d": "\\\\u0000"}
    assert logged[0][2] == escaped and logged[-1][2] == escaped
    assert drain(config).changes == 0
    with source_db.connect() as conn:
        confirmed = conn.execute("SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint FROM "
                                 "pg_replication_slots WHERE slot_name = 'cdc_test'").fetchone()
    assert committed is not None and confirmed is not None and confirmed[0] >= committed[0]

    # A backfill reads the row as the drain logged it (the same record), instead of failing on to_jsonb.
    result = backfill(config, "public.docs")
    assert result.status == "completed" and len(log_reads(config, result.backfill_id)) == 50
    with psycopg.connect(config.state_dsn) as conn:
        read, change = (conn.execute(f"SELECT record FROM cdc_pipeline.change_log WHERE pk = '[51]' AND action = "
                                     f"'{a}'").fetchone() for a in ("read", "insert"))
    assert read == change

    deliver(config, spark)
    mirrored = {r["id"]: r for r in rows(dest.dsn, "mirror.docs")}
    with source_db.connect() as conn:
        source = {r[0]: r[1] for r in conn.execute("SELECT id, to_jsonb(t) FROM (SELECT id, jb, n, "
                                                   "CASE WHEN id IN (1, 51) THEN NULL ELSE j END AS j FROM docs) t")}
    assert sorted(mirrored) == sorted(source) == [*range(1, 50), 51]
    for key, row in source.items():
        if key in (1, 51):
            assert mirrored[key]["j"] == escaped and mirrored[key]["n"] == row["n"]
        else:
            assert mirrored[key] == row
