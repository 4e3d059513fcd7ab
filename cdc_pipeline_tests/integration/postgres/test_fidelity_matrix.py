"""Fidelity (issue 20), black-box: every value of a type matrix (fidelity_values.py) arrives exactly.

- Records: every read message and the last change per key equal `to_jsonb(row)` of the source row (as
  jsonb, TimeZone UTC), and a change and a read of the same unchanged row give identical JSON; reads go
  through both read paths (typed, for a mirror, and JSON, for an append sink alone).
- Mirror: every column equal to the source by output text (`c::text IS NOT DISTINCT FROM`), which holds
  JSON `null` apart from SQL NULL and keeps array lower bounds.
- A `numeric` with a negative scale neither stops the mirror sink nor arrives altered.
- A `json` value that `jsonb` refuses stops neither the drain nor a backfill: it is carried in the record
  as a JSON string holding the json text exactly, the mirror holds that text, later changes of every
  table arrive (also while the drain streams).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.json_text import escape_nul
from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline_tests import fidelity_values as fv
from cdc_pipeline_tests.conftest import Database, _drop
from cdc_pipeline_tests.helpers import deliver, drain
from cdc_pipeline_tests.integration.backfill.test_backfill import (
    backfill,
    backfill_config,
    drain_running,
    wait_for,
)
from cdc_pipeline_tests.pg_versions import server_major

# How values print when compared: the settings `to_jsonb` and `::text` depend on, the same on both sides.
OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres -c extra_float_digits=1"
CHANGED = 100  # the change path's rows of a table are its rows again, with ids + CHANGED
REFUSED = [r'{"a": "\ud83d\ud83d"}', r'"\ude04X"', r'{"n": 1e200000}', r'["\ud83d"]', r'{"k": "\udc00", "b": 1}']
NUL = r'{"a": "x\u0000y"}'


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, options=OPTIONS)


def two_sinks_config(source: Database, dest: Database, tables: list[str]) -> dict[str, Any]:
    """A mirror (`mirror.<table>`) and an append sink (`appended.messages`, one row per message)."""
    data = backfill_config(source.dsn, dest.dsn, tables, {"initial_page_size": 3, "max_page_size": 3})
    data["source"]["slot"] = "fid_" + uuid.uuid4().hex[:8]
    data["sinks"].append({"name": "appended", "tables": tables, "destination": {
        "type": "postgres", "dsn": dest.dsn, "table": "appended.messages", "mode": "append"}})
    return data


def delivered(config: PipelineConfig, spark: Any, sink: str) -> list[str]:
    """Deliver what the log holds to `sink`; the errors of the messages it parked."""
    stats = deliver(config, spark, sink=sink)
    with psycopg.connect(config.state_dsn) as conn:
        errors = [f"{r[0]} {r[1]}: {r[2]}" for r in conn.execute(
            "SELECT l.table_name, l.pk, f.last_error FROM cdc_pipeline.failed_messages f JOIN cdc_pipeline.change_log l "
            "USING (commit_lsn, commit_idx) WHERE f.sink = %s ORDER BY 1, 2", (sink,)).fetchall()]
    assert stats.parked == len(errors)
    return errors


def messages(dest: Database, table: str) -> list[tuple[int, str, str]]:
    """(key, action, record as jsonb text) of `public.<table>` in the append sink, in log order."""
    with connect(dest.dsn) as conn:
        return [(int(r[0]), r[1], r[2]) for r in conn.execute(
            "SELECT message->'record'->>'id', action, (message->'record')::text FROM appended.messages "
            "WHERE table_schema = 'public' AND table_name = %s ORDER BY commit_lsn, commit_idx", (table,))]


def record_mismatches(source: Database, table: str, got: list[tuple[int, str, str]],
                      relation: sql.Composable | None = None) -> list[tuple[Any, ...]]:
    """(key, action, column, record's value, to_jsonb's value) wherever a record differs from
    `to_jsonb` of the source row now (compared as jsonb); `relation` instead of the table: a subquery."""
    if not got:
        return []
    keys, kinds, recs = zip(*got, strict=True)
    with connect(source.dsn) as conn:
        return [tuple(r) for r in conn.execute(sql.SQL(
            "WITH k AS (SELECT k.key, k.kind, k.rec::jsonb AS rec, to_jsonb(src_row) AS want "
            "  FROM unnest(%s::int[], %s::text[], %s::text[]) AS k(key, kind, rec) LEFT JOIN {} src_row ON src_row.id = k.key) "
            "SELECT key, kind, '<record>', left(rec::text, 120), left(want::text, 120) FROM k "
            "WHERE jsonb_typeof(rec) IS DISTINCT FROM 'object' "
            "UNION ALL SELECT key, kind, c.col, left((rec -> c.col)::text, 120), left((want -> c.col)::text, 120) "
            "FROM k CROSS JOIN LATERAL jsonb_object_keys(coalesce(want, '{{}}') || rec) AS c(col) "
            "WHERE jsonb_typeof(rec) = 'object' AND (rec -> c.col) IS DISTINCT FROM (want -> c.col) ORDER BY 3, 1"
        ).format(relation or sql.Identifier("public", table)), (list(keys), list(kinds), list(recs))).fetchall()]


def as_text(dsn: str, table: tuple[str, str], columns: list[str]) -> dict[int, tuple[str | None, ...]]:
    """Each column's output text by key. `xml::text` is the stored text; its output function (what
    logical decoding sends) drops a version-1.0 declaration, so an xml column is compared by its output."""
    with connect(dsn) as conn:
        xml = {r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                                          "AND atttypid = 'xml'::regtype", (".".join(table),))}
        return {r[0]: tuple(r[1:]) for r in conn.execute(sql.SQL("SELECT id, {} FROM {}").format(
            sql.SQL(", ").join(sql.SQL("textin(xml_out({}))" if c in xml else "{}::text").format(sql.Identifier(c))
                               for c in columns), sql.Identifier(*table))).fetchall()}


def mirror_mismatches(source: Database, dest: Database, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    """(column, key, source text, mirror text) wherever the mirror's output text differs from the source's."""
    with connect(dest.dsn) as conn:
        have = [r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                                           "AND attnum > 0 AND NOT attisdropped", (f"mirror.{table}",))]
    assert sorted(have) == sorted(["id", *columns]), f"mirror.{table} has columns {have}"
    src, dst = as_text(source.dsn, ("public", table), columns), as_text(dest.dsn, ("mirror", table), columns)
    missing = [(columns[0], key, "<row>", "<missing>") for key in sorted(set(src) - set(dst))]
    extra = [(columns[0], key, "<missing>", "<row>") for key in sorted(set(dst) - set(src))]
    return missing + extra + [(c, key, a if a is None else a[:120], b if b is None else b[:120])
                              for key in sorted(set(src) & set(dst))
                              for c, a, b in zip(columns, src[key], dst[key], strict=True) if a != b]


def first_of_each(mismatches: list[tuple[Any, ...]], kind: Callable[[tuple[Any, ...]], Any]) -> list[tuple[Any, ...]]:
    """The first mismatch of each kind (a column, ...) and how many there are: a readable failure message."""
    seen: dict[Any, list[Any]] = {}
    for m in mismatches:
        seen.setdefault(kind(m), [m, 0])[1] += 1
    return [(*m, f"{n}x") for m, n in seen.values()]


def report(parked: list[str], what: str, failures: dict[str, list[tuple[Any, ...]]]) -> str:
    return f"parked: {parked}\n{what}:\n" + "\n".join(f"{name}: {m}" for name, ms in failures.items() for m in ms)


# -- the type matrix: rows read by backfills, the same rows again (and updated) as changes -----------------


@pytest.fixture(scope="module")
def matrix(pg_server: str, pg_dest_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    source, dest = (Database(server, f"t_{uuid.uuid4().hex[:12]}") for server in (pg_server, pg_dest_server))
    for db in (source, dest):
        with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db.name)))
    try:
        tables = fv.tables_for(server_major(pg_server))  # the same names and row counts as fv.TABLES
        with source.connect() as conn:
            conn.execute(fv.USER_TYPES)
            for table in tables:
                conn.execute(fv.create_sql(table))
                conn.execute(fv.insert_sql(table))
        path = tmp_path_factory.mktemp("fidelity") / "cdc.yaml"
        path.write_text(json.dumps(two_sinks_config(source, dest, [f"public.{t.name}" for t in fv.TABLES])))
        config = load_config(path)
        setup(config)
        with source.connect() as conn:  # the change path: every row again as an insert, and every row updated
            for table in tables:
                conn.execute(fv.insert_sql(table, CHANGED))
                conn.execute(fv.rotate_sql(table, range(1, len(table.rows) + 1)))
        drain(config)
        with drain_running(config):  # reads of both paths: typed (a mirror takes them) and JSON (append only)
            for table in fv.TABLES:
                for sinks in [(), ("appended",)]:
                    result = backfill(config, f"public.{table.name}", with_drain=False, sinks=sinks)
                    assert (result.status, result.rows_read) == ("completed", 2 * len(table.rows)), table.name
        yield config, source, dest
    finally:
        for db in (source, dest):
            _drop(db.admin_dsn, db.name)


@pytest.mark.pg_matrix
def test_every_record_equals_to_jsonb_through_changes_and_reads(matrix, spark):
    config, source, dest = matrix
    parked = delivered(config, spark, "appended")
    failures: dict[str, list[tuple[Any, ...]]] = {}
    for table in fv.TABLES:
        got = messages(dest, table.name)
        last_change = {key: (key, kind, rec) for key, kind, rec in got if kind != "read"}
        reads = [m for m in got if m[1] == "read"]
        keys = [*range(1, len(table.rows) + 1), *range(CHANGED + 1, CHANGED + len(table.rows) + 1)]
        wrong: list[tuple[Any, ...]] = [(key, "missing", "*", None, None) for key in keys if key not in last_change
                                         or [m[0] for m in reads].count(key) != 2]  # a read by each backfill
        wrong += record_mismatches(source, table.name, [*last_change.values(), *reads])
        # A change and a read of the same (unchanged) row: the same JSON.
        wrong += [(key, "read != change", "*", rec[:120], last_change[key][2][:120])
                  for key, _, rec in reads if key in last_change and rec != last_change[key][2]]
        if wrong:
            failures[table.name] = first_of_each(wrong, lambda m: (m[2], m[1] == "read"))
    assert not parked and not failures, report(
        parked, "records differ from to_jsonb(row) (key, action, column, record, to_jsonb)", failures)


@pytest.mark.pg_matrix
def test_the_mirror_holds_every_column_equal_by_output_text(matrix, spark):
    config, source, dest = matrix
    parked = delivered(config, spark, "mirror")
    failures = {t.name: first_of_each(mirror_mismatches(source, dest, t.name, [c for c, _ in t.columns]),
                                      lambda m: m[0]) for t in fv.TABLES}
    assert not parked and not any(failures.values()), report(
        parked, "mirror differs from source (column, key, source, mirror)", failures)


# -- numeric with a negative scale -----------------------------------------------------------------------


def test_a_negative_scale_numeric_neither_stops_the_mirror_nor_changes(db_factory, write_config, spark):
    source, dest = db_factory(), db_factory()
    source.execute("CREATE TABLE neg (id int PRIMARY KEY, n numeric(3,-6), m numeric(5,-2), a numeric(2,-1)[]);"
                   "CREATE TABLE plain (id int PRIMARY KEY, v text);"
                   "INSERT INTO neg VALUES (1, 123456789, -9999949, '{10,NULL,-990}'), (2, NULL, 0, '{}')")
    config = write_config(two_sinks_config(source, dest, ["public.neg", "public.plain"]))
    setup(config)
    source.execute("INSERT INTO neg VALUES (3, -999000000, 49, '[0:0]={94}'), (4, 500000, 151, NULL);"
                   "UPDATE neg SET m = m + 100 WHERE id = 1; INSERT INTO plain VALUES (2, 'after')")
    drain(config)
    result = backfill(config, "public.neg")
    assert (result.status, result.rows_read) == ("completed", 4)
    source.execute("INSERT INTO plain VALUES (3, 'after the backfill')")
    drain(config)
    assert [delivered(config, spark, sink) for sink in ("mirror", "appended")] == [[], []]
    assert source.execute("SELECT n::text FROM neg WHERE id = 1") == [("123000000",)]
    for table, columns in [("neg", ["n", "m", "a"]), ("plain", ["v"])]:
        assert mirror_mismatches(source, dest, table, columns) == [], table
    got = messages(dest, "neg")  # three changes (each its key's last) and four reads
    assert len(got) == 3 + 4 and record_mismatches(source, "neg", got) == []


# -- json that jsonb refuses -----------------------------------------------------------------------------


def docs_and_others(source: Database, dest: Database, write_config: Any) -> PipelineConfig:
    source.execute("CREATE TABLE docs (id int PRIMARY KEY, j json, jb jsonb, n int);"
                   "CREATE TABLE others (id int PRIMARY KEY, v text)")
    return write_config(two_sinks_config(source, dest, ["public.docs", "public.others"]))


def check_docs(source: Database, dest: Database, keys: list[int]) -> None:
    """Every message of `docs`: a refused `j` is a JSON string holding the json text exactly, a NUL escape
    is logged as the text `\\u0000`, anything else is `to_jsonb(row)`; the mirror holds `j` exactly."""
    with connect(source.dsn) as conn:
        j = dict(conn.execute("SELECT id, j::text FROM docs").fetchall())
    refused = {k for k, text in j.items() if text in REFUSED}
    assert sorted(j) == keys and len(refused) == 2 * len(REFUSED)
    nul = {k for k, text in j.items() if text is not None and "\\u0000" in text}
    got = messages(dest, "docs")
    for key, action, rec in got:
        value = json.loads(rec).get("j", "<missing>")
        if key in refused:
            assert value == j[key], (key, action, value, j[key])
        elif key in nul:
            assert value == json.loads(escape_nul(j[key])), (key, action, value)
    assert record_mismatches(source, "docs", [m for m in got if m[0] not in refused | nul]) == []
    # to_jsonb(row) fails on a refused value: every other column compared without `j`, in each key's last
    # message (an earlier one may hold a version the source no longer has)
    last = {k: (k, a, r) for k, a, r in got}
    without_j = [(k, a, json.dumps({c: v for c, v in json.loads(r).items() if c != "j"})) for k, a, r in last.values()]
    assert record_mismatches(source, "docs", without_j, sql.SQL("(SELECT id, jb, n FROM public.docs)")) == []
    columns = ["j", "jb", "n"]
    mirrored = as_text(dest.dsn, ("mirror", "docs"), columns)
    for key, (jt, jb, n) in as_text(source.dsn, ("public", "docs"), columns).items():
        if key in nul:  # today's documented behaviour: the escape arrives as the text `\\u0000`
            assert json.loads(mirrored[key][0] or "") == json.loads(escape_nul(jt or "")), key
            jt = mirrored[key][0]
        assert mirrored[key] == (jt, jb, n), key


def test_json_that_jsonb_refuses_stops_neither_the_drain_nor_a_backfill(db_factory, write_config, spark):
    source, dest = db_factory(), db_factory()
    config = docs_and_others(source, dest, write_config)
    with source.connect() as conn:  # before setup: only a backfill reads these
        for i, text in enumerate([*REFUSED, NUL, "null", ' {"a" : 1, "a": 2} '], 1):
            conn.execute("INSERT INTO docs VALUES (%s, %s::json, %s, %s)", (i, text, '{"jb": null}', i))
        conn.execute("INSERT INTO docs VALUES (9, NULL, 'null', 9)")
    setup(config)
    with source.connect() as conn:  # the change path: the same values as inserts, then some rows updated
        for i, text in enumerate([*REFUSED, NUL, "null"], 11):
            conn.execute("INSERT INTO docs VALUES (%s, %s::json, NULL, %s)", (i, text, i))
        conn.execute("UPDATE docs SET n = n + 100 WHERE id IN (1, 3, 11, 13)")
        conn.execute("INSERT INTO others VALUES (1, 'after the refused values')")
        conn.execute("INSERT INTO docs VALUES (20, '[1, 2]', '[3]', 20)")
    stats = drain(config)
    assert stats.changes == len(REFUSED) + 2 + 4 + 1 + 1
    result = backfill(config, "public.docs")
    assert (result.status, result.rows_read) == ("completed", 9 + len(REFUSED) + 2 + 1)
    source.execute("INSERT INTO others VALUES (2, 'after the backfill'); UPDATE docs SET n = -1 WHERE id = 2")
    drain(config)
    assert [delivered(config, spark, sink) for sink in ("mirror", "appended")] == [[], []]
    assert [m[0] for m in messages(dest, "others")] == [1, 2]
    assert mirror_mismatches(source, dest, "others", ["v"]) == []
    check_docs(source, dest, [*range(1, 10), *range(11, 11 + len(REFUSED) + 2), 20])


def test_a_streaming_drain_passes_a_refused_json_and_keeps_streaming(db_factory, write_config):
    source, dest = db_factory(), db_factory()
    config = docs_and_others(source, dest, write_config)
    setup(config)

    def logged(table: str, key: int) -> bool:
        with psycopg.connect(config.state_dsn) as conn:
            return conn.execute("SELECT 1 FROM cdc_pipeline.change_log WHERE table_name = %s AND pk = %s",
                                (table, f"[{key}]")).fetchone() is not None

    with drain_running(config):
        source.execute("INSERT INTO others VALUES (1, 'first')")
        wait_for(lambda: logged("others", 1), what="the first change")
        for i, text in enumerate(REFUSED, 1):
            source.execute("INSERT INTO docs VALUES (%s, %s::json, NULL, %s)", (i, text, i))
        source.execute("INSERT INTO others VALUES (2, 'after'); INSERT INTO docs VALUES (99, '{}', '{}', 99)")
        wait_for(lambda: logged("others", 2) and logged("docs", 99), timeout=60,
                 what="changes after refused json values (drain stalled?)")
    # (the records' contents are checked at the sinks, in the test above)
    assert all(logged("docs", i) for i in range(1, len(REFUSED) + 1))
