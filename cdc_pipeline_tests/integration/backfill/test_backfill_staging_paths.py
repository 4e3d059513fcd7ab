"""Both ways a backfill page is staged carry every core type identically: one INSERT ... SELECT when the
state lives in the source database, the binary COPY relay (backfill/copybinary.py) when it lives
elsewhere. The logged reads are byte for byte the same, and both mirrors equal the source."""

from __future__ import annotations

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import assert_mirrored, deliver
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill, backfill_config, pages_of
from cdc_pipeline_tests.integration.delivery.test_core_mirror import INSERT_ALL, TYPES_DDL

EXTRA_ROW = """
INSERT INTO public.everything (id, t, jb, by, ai, at, m, nbig, tstz)
VALUES (4, E'tab\\there\\nnewline \\\\ back', '{"k": "line\\nbreak", "n": 1.50}', '\\x5c0a09', '{-1}',
        '{"q\\"uote"}', 'sad', '-0.000000000000000000001', '1999-12-31 23:59:59.999999+00')
"""


def _reads(config) -> list[tuple[str, str, str]]:
    with psycopg.connect(config.state_dsn) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT pk, record::text, commit_ts::text FROM cdc_pipeline.change_log WHERE action = 'read' "
            "ORDER BY commit_lsn, commit_idx").fetchall()]


def test_every_type_arrives_identically_through_both_staging_paths(db_factory, write_config, spark):
    logged = {}
    for path in ("same-database", "separate-state"):
        source, dest = db_factory(), db_factory()
        source.execute(TYPES_DDL)
        source.execute(INSERT_ALL)
        source.execute(EXTRA_ROW)
        data = backfill_config(source.dsn, dest.dsn, ["public.everything"],
                               {"initial_page_size": 1, "max_page_size": 1})
        data["source"]["slot"] = "cdc_test_" + path.replace("-", "_")  # one cluster: a slot each
        if path == "separate-state":
            data["state"] = {"dsn": db_factory().dsn}
        config = write_config(data)
        setup(config)
        result = backfill(config, "public.everything")
        assert (result.status, result.rows_read, result.rows_dropped) == ("completed", 3, 0)
        pages = pages_of(config, result.backfill_id)
        assert [p["rows"] for p in pages] == [1, 1, 1, 0]  # the last page empty: header and trailer only
        assert [p["cursor"] for p in pages[:3]] == [["1"], ["2"], ["4"]]
        logged[path] = [(pk, record) for pk, record, _ in _reads(config)]
        deliver(config, spark)
        assert assert_mirrored(source.dsn, "public.everything", dest.dsn, "mirror.everything") == 3
    assert len(logged["same-database"]) == 3
    assert logged["separate-state"] == logged["same-database"]
