"""Data-driven routes (issue 15.2): a bad route parks its message, never fails the run; `route_schemas` confines
where routes may create or write tables."""

from __future__ import annotations

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import deliver, drain, mirror_config


def test_bad_and_foreign_routes_park_their_message_only(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE r (id int PRIMARY KEY, dest text)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.r"], route="record.dest")
    data["sinks"][0]["destination"].update(table="out.fallback", mode="append", route_schemas=["out"])
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO r VALUES (1, 'out.good'), (2, 'not a table!'), (3, 'evil.pwn'), (4, NULL), "
                      "(5, 'out.\"Good%s\"'), (6, 'a.b.c')")
    drain(config)
    stats = deliver(config, spark)
    assert (stats.delivered, stats.parked) == (3, 3)
    with psycopg.connect(dest.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM out.good").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM out.fallback").fetchone() == (1,)
        assert conn.execute('SELECT count(*) FROM out."Good%s"').fetchone() == (1,)
        assert conn.execute("SELECT to_regnamespace('evil')").fetchone() == (None,)
    with psycopg.connect(config.state_dsn) as conn:
        errors = sorted(r[0] for r in conn.execute("SELECT last_error FROM cdc_pipeline.failed_messages"))
    assert errors == ["invalid route 'a.b.c': not a schema.table name",
                      "invalid route 'not a table!': not a schema.table name",
                      "route 'evil.pwn' is outside the sink's route_schemas (out)"]


def test_check_reports_a_sink_role_that_cannot_create_its_tables(source_db, db_factory, write_config):
    from psycopg import conninfo

    from cdc_pipeline.sinks import sink_class

    dest = db_factory()
    source_db.execute("CREATE TABLE r (id int PRIMARY KEY)")
    dest.execute("DROP ROLE IF EXISTS cdc_weak; CREATE ROLE cdc_weak LOGIN PASSWORD 'WeakPw123'")
    try:
        dest.execute("CREATE SCHEMA out; REVOKE CREATE ON DATABASE " + dest.name + " FROM PUBLIC")
        weak = conninfo.make_conninfo(dest.dsn, user="cdc_weak", password="WeakPw123")
        data = mirror_config(source_db.dsn, weak, ["public.r"])
        data["sinks"][0]["destination"].update(table="out.r")
        config = write_config(data)
        sink = config.sinks[0]
        findings = [str(f) for f in sink_class(sink).check_findings(sink)]
        errors = [f for f in findings if "may not create tables" in f]
        assert any("'out'" in f for f in errors) and any("'cdc_pipeline_sink'" in f for f in errors), findings
        assert not any("WeakPw123" in f for f in findings)
        dest.execute("GRANT CREATE, USAGE ON SCHEMA out TO cdc_weak; GRANT CREATE ON DATABASE " + dest.name
                     + " TO cdc_weak")
        assert sink_class(sink).check_findings(sink) == []
    finally:
        dest.execute("DROP OWNED BY cdc_weak; DROP ROLE cdc_weak")
