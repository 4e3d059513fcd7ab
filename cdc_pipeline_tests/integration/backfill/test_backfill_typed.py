"""Typed reads (backfill/typed.py): a backfill bound for a Postgres mirror stages each row as composite
text instead of `to_jsonb`, the mirror applies it without JSON, and every other consumer gets JSON made
from it that is identical to what the JSON path logs. Every core type, NULLs, a toasted value that a
later update leaves unchanged, both staging paths (state in the source database or elsewhere), and
typed reads interleaved with changes in one delivery batch.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, wait_until
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill, backfill_config

# The core types of test_core_mirror, without `json` (it keeps the JSON path: its NUL escapes are
# rewritten there), plus an enum array and a value large enough to be toasted.
DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE public.typed (
  id bigint PRIMARY KEY, i2 smallint, i4 integer, n numeric(20,6), nbig numeric, f4 real, f8 double precision,
  b boolean, t text, vc varchar(20), u uuid, d date, ts timestamp, tstz timestamptz, jb jsonb,
  by bytea, ai integer[], at text[], m mood, ms mood[], iv interval, tm time, c char(3), big text
);
"""
ROWS = """
INSERT INTO public.typed VALUES
 (1, 1, -2, 12345678901234.123456, 123456789012345678901234567890.123456789, 1.5, -2.25e100, true, 'hé "q" \\ x',
  'v', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2025-01-02', '2025-01-02 03:04:05.678', '2025-01-02 03:04:05+05:30',
  '{"z": 1, "a": {"k": "v"}, "s": "line\\nbreak", "n": 1.50}', '\\x00ff10', '{1,NULL,3}', '{"a b","c,d",NULL,"(x)"}',
  'happy', '{sad,happy}', '1 day 02:00:00', '10:11:12', 'ab', repeat('toast', 5000)),
 (2, NULL, NULL, NULL, 'NaN', 'NaN', 'Infinity', false, '', NULL, NULL, 'infinity', '-infinity', NULL, '[]',
  '\\x', '{}', '{}', NULL, '{}', NULL, NULL, NULL, NULL),
 (3, -32768, 2147483647, -0.000001, '-0.000000000000000000001', 0.1, 1e-300, NULL, E'tab\\there\\nnl \\\\ "()",',
  '(,)', NULL, '0001-01-01 BC', '2000-02-29 23:59:59.999999', '1999-12-31 23:59:59.999999+00', '{"k": null}',
  '\\x5c0a0922', '{-1}', '{"q\\"uote","",NULL}', 'ok', '{NULL,ok}', '-1 mons +2 days -00:00:01.5', '23:59:59.999999',
  '', md5('x'))
"""


def _config(source: Any, dest: Any, write_config: Any, state: Any | None = None, slot: str = "cdc_test") -> Any:
    data = backfill_config(source.dsn, dest.dsn, ["public.typed"], {"initial_page_size": 2, "max_page_size": 2})
    data["source"]["slot"] = slot
    data["sinks"] += [
        # The JSON path into a mirror: a filter needs the record (Spark).
        {"name": "spark_mirror", "tables": ["public.typed"], "filter": "true",
         "destination": {"type": "postgres", "dsn": dest.dsn, "table": "spark.{table}", "mode": "mirror"}},
        {"name": "appended", "tables": ["public.typed"],
         "destination": {"type": "postgres", "dsn": dest.dsn, "table": "appended.typed", "mode": "append"}},
    ]
    if state is not None:
        data["state"] = {"dsn": state.dsn}
    config = write_config(data)
    setup(config)
    return config


def _reads(config: Any, backfill_id: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(config.state_dsn) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT pk, record IS NULL, tup IS NOT NULL, cdc_pipeline.typed_record(backfill_id, tup)::text "
            "FROM cdc_pipeline.change_log WHERE backfill_id = %s ORDER BY commit_lsn, commit_idx",
            (backfill_id,)).fetchall()]


def _appended_records(dest: Any, backfill_id: str) -> dict[str, str]:
    with psycopg.connect(dest.dsn) as conn:
        return {str(r[0]): r[1] for r in conn.execute(
            "SELECT message->'record'->>'id', (message->'record')::text FROM appended.typed "
            "WHERE message->'metadata'->>'backfill_id' = %s", (backfill_id,)).fetchall()}


@pytest.mark.parametrize("path", ["same-database", "separate-state"])
def test_every_type_identical_through_typed_and_json_paths(path, db_factory, write_config, spark):
    source, dest = db_factory(), db_factory()
    source.execute(DDL)
    source.execute(ROWS)
    config = _config(source, dest, write_config, db_factory() if path == "separate-state" else None,
                     slot="cdc_typed_" + path.replace("-", "_"))
    # 1. Typed: the mirror takes typed rows, so pages are staged as composite text, not JSON.
    typed = backfill(config, "public.typed")
    assert (typed.status, typed.rows_read, typed.rows_dropped) == ("completed", 3, 0)
    reads = _reads(config, typed.backfill_id)
    assert [r[:3] for r in reads] == [("[1]", True, True), ("[2]", True, True), ("[3]", True, True)]
    # 2. JSON: the same rows for the append sink alone (no sink takes typed rows): to_jsonb as before.
    plain = backfill(config, "public.typed", sinks=("appended",))
    assert (plain.status, plain.rows_read) == ("completed", 3)
    assert [r[1:3] for r in _reads(config, plain.backfill_id)] == [(False, False)] * 3
    # An unchanged toasted value: an update after the reads that leaves `big` alone (not in its record).
    source.execute("UPDATE public.typed SET i4 = 7 WHERE id = 1")
    drain(config)
    for sink in ("mirror", "spark_mirror", "appended"):
        stats = deliver(config, spark, sink=sink)
        assert (stats.parked, stats.delivered) == (0, 7 if sink == "appended" else 4), (sink, stats)
    assert assert_mirrored(source.dsn, "public.typed", dest.dsn, "mirror.typed") == 3
    assert assert_mirrored(source.dsn, "public.typed", dest.dsn, "spark.typed") == 3
    # The JSON made from a typed read is byte for byte the JSON path's record (as jsonb text), and is what
    # the JSON sinks received.
    from_typed, from_json = _appended_records(dest, typed.backfill_id), _appended_records(dest, plain.backfill_id)
    assert len(from_json) == 3
    assert from_typed == from_json
    assert [r[3] for r in reads] == [from_json[k] for k in ("1", "2", "3")]


def test_typed_reads_and_changes_in_one_batch_keep_per_key_order(db_factory, write_config, spark):
    """Reads, then changes to the same keys, then another backfill's reads, then changes: four runs of the
    log (typed reads are relayed, changes go as messages), applied in log order."""
    source, dest = db_factory(), db_factory()
    source.execute(DDL)
    source.execute(ROWS)
    config = _config(source, dest, write_config, slot="cdc_typed_order")
    first = backfill(config, "public.typed", sinks=("mirror",))
    source.execute("UPDATE public.typed SET t = 'after first', big = 'small' WHERE id = 1;"
                   "DELETE FROM public.typed WHERE id = 2;"
                   "INSERT INTO public.typed (id, t) VALUES (4, 'new');"
                   "UPDATE public.typed SET id = 30 WHERE id = 3")
    drain(config)
    second = backfill(config, "public.typed", sinks=("mirror",))
    source.execute("UPDATE public.typed SET i2 = 9 WHERE id = 4; DELETE FROM public.typed WHERE id = 30")
    drain(config)
    assert (first.rows_read, second.rows_read) == (3, 3)
    stats = deliver(config, spark, sink="mirror")
    assert stats.parked == 0 and stats.batches == 4
    assert assert_mirrored(source.dsn, "public.typed", dest.dsn, "mirror.typed") == 2


def test_a_table_with_a_json_column_keeps_the_json_path(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.withjson (id int PRIMARY KEY, j json, m text);"
                      "INSERT INTO public.withjson VALUES (1, '{\"a\": \"\\u0000\"}', 'x')")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.withjson"]))
    setup(config)
    result = backfill(config, "public.withjson")
    assert _reads(config, result.backfill_id)[0][1:3] == (False, False)
    deliver(config, spark)
    with psycopg.connect(dest.dsn) as conn:
        assert conn.execute("SELECT j::text FROM mirror.withjson").fetchone() == ('{"a": "\\\\u0000"}',)


def test_two_typed_partitions_side_by_side_under_writers(source_db, db_factory, write_config, spark):
    """Two windows of one table at once, four writers racing them: the pages are typed (the mirror takes
    typed rows, the append sink gets JSON made from them), the mirror ends equal to the source, and no
    row's version ever goes backwards in the append sink's arrival order."""
    import threading

    from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
    from cdc_pipeline_tests.integration.backfill.test_backfill import drain_running
    from cdc_pipeline_tests.integration.backfill.test_backfill_concurrency import (
        SMALL_ROWS,
        Writers,
        check_final_state,
        make_table,
        two_sinks,
    )

    dest = db_factory()
    make_table(source_db, SMALL_ROWS)  # the page count (10 per window) matters here, not the rows
    config = write_config(two_sinks(source_db, dest, max_page_size=2500))
    setup(config)
    results: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(start: str, end: str) -> None:
        try:
            barrier.wait(30)
            results.append(Backfiller(config, BackfillRequest("public.acct", sort_column="id", start=start,
                                                              end=end)).run())
        except BaseException as exc:
            errors.append(exc)

    with drain_running(config), Writers(source_db.dsn, config.state_dsn, seed=11, rows=SMALL_ROWS):
        threads = [threading.Thread(target=run, args=w) for w in [("1", str(SMALL_ROWS // 2)), (str(SMALL_ROWS // 2), "1000000000")]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    assert not errors, errors
    assert sorted(r.status for r in results) == ["completed", "completed"]
    with psycopg.connect(config.state_dsn) as conn:
        kinds = conn.execute("SELECT count(*) FILTER (WHERE tup IS NOT NULL AND record IS NULL), count(*) "
                             "FROM cdc_pipeline.change_log WHERE action = 'read'").fetchone()
    assert kinds is not None and kinds[0] == kinds[1] == sum(r.rows_emitted for r in results)
    figures = check_final_state(config, source_db, dest, spark)
    assert figures["reads"] == kinds[1]


def _spy_typed_batches(monkeypatch: Any) -> tuple[list[str | None], list[int]]:
    """What the mirror's whole-batch typed path answered, and the sizes of message-by-message calls."""
    from cdc_pipeline.sinks.postgres.client import PostgresSink

    answers: list[str | None] = []
    calls: list[int] = []
    whole, per_message = PostgresSink.deliver_typed_run, PostgresSink.deliver

    def typed_batch(self: Any, run: Any, blocks: Any) -> str | None:
        answers.append(whole(self, run, blocks))
        return answers[-1]

    def deliver_messages(self: Any, batch: Any) -> Any:
        calls.append(len(batch))
        return per_message(self, batch)

    monkeypatch.setattr(PostgresSink, "deliver_typed_run", typed_batch)
    monkeypatch.setattr(PostgresSink, "deliver", deliver_messages)
    return answers, calls


def test_a_run_of_typed_reads_is_relayed_whole(db_factory, write_config, spark, monkeypatch):
    """Every type (tabs, newlines, backslashes and quotes in the composite text) through the whole-batch
    path: no message per row, the sink's position recorded with it."""
    source, dest = db_factory(), db_factory()
    source.execute(DDL)
    source.execute(ROWS)
    config = _config(source, dest, write_config, slot="cdc_typed_whole")
    backfill(config, "public.typed", sinks=("mirror",))
    backfill(config, "public.typed", sinks=("mirror",))  # a second shape number is not needed: same shape
    answers, calls = _spy_typed_batches(monkeypatch)
    stats = deliver(config, spark, sink="mirror")
    assert (answers, calls) == ([None], [])
    assert (stats.delivered, stats.parked) == (6, 0)
    assert assert_mirrored(source.dsn, "public.typed", dest.dsn, "mirror.typed") == 3
    with psycopg.connect(config.state_dsn) as conn, psycopg.connect(dest.dsn) as dconn:
        last = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log "
                            "ORDER BY commit_lsn DESC, commit_idx DESC LIMIT 1").fetchone()
        mine = dconn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline_sink.offsets "
                             "WHERE sink = 'mirror'").fetchone()
    assert last is not None and mine == last


def test_a_rejection_in_a_typed_batch_parks_the_failing_read_and_holds_its_group(
        source_db, db_factory, write_config, spark, monkeypatch):
    """Three backfills' reads of five keys, with updates (not for this sink) between them: three runs of
    typed reads. The mirror rejects the last read of key 3: its run falls back to message by message,
    exactly that read is parked, every other read is applied in order (key 3 keeps its second read). A
    later run of typed reads with a read of key 3 goes message by message too (a group is parked): that
    read is held behind the parked one. Once the fault is gone the retries apply key 3's reads in order."""
    from cdc_pipeline.cli import main

    dest = db_factory()
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance int, note text);"
                      "INSERT INTO acct SELECT g, 0, E'a\\tb\\\\c\\n\"(x)\"' FROM generate_series(1, 5) g")
    data = backfill_config(source_db.dsn, dest.dsn, ["public.acct"], actions=["insert", "delete"],
                           backoff={"initial_ms": 600_000, "max_ms": 600_000, "jitter": 0})  # retried on demand
    data["delivery"] = {**data.get("delivery", {}), "batch_size": 5}  # a run as long as a batch falls back too
    config = write_config(data)
    setup(config)
    dest.execute("CREATE SCHEMA mirror; CREATE TABLE mirror.acct (id int PRIMARY KEY, balance int, note text, "
                 "CONSTRAINT poison CHECK (id <> 3 OR balance <> 2))")
    for balance in (1, 2, None):
        backfill(config, "public.acct")
        if balance is not None:
            source_db.execute("UPDATE acct SET balance = %s", (balance,))
    drain(config)
    answers, calls = _spy_typed_batches(monkeypatch)
    stats = deliver(config, spark)
    assert answers[:2] == [None, None] and len(answers) == 3 and answers[2] is not None and "poison" in answers[2]
    assert calls == [5, 2]  # the rejected run again, then (after key 3's last read failed) the rest
    assert (stats.delivered, stats.parked, stats.filtered) == (14, 1, 10)
    assert dict(dest.execute("SELECT id, balance FROM mirror.acct")) == {1: 2, 2: 2, 3: 1, 4: 2, 5: 2}
    source_db.execute("UPDATE acct SET balance = 4")
    backfill(config, "public.acct")
    drain(config)
    stats = deliver(config, spark)
    assert len(answers) == 3 and calls[2:] == [4]  # not relayed; key 3's read never reached the sink
    assert (stats.delivered, stats.parked) == (4, 1)
    assert dict(dest.execute("SELECT id, balance FROM mirror.acct")) == {1: 4, 2: 4, 3: 1, 4: 4, 5: 4}
    with psycopg.connect(config.state_dsn) as conn:
        parked = conn.execute(
            "SELECT l.pk, f.attempts > 0, l.backfill_id FROM cdc_pipeline.failed_messages f "
            "JOIN cdc_pipeline.change_log l USING (commit_lsn, commit_idx) ORDER BY commit_lsn, commit_idx").fetchall()
        order = [r[0] for r in conn.execute("SELECT id FROM cdc_pipeline.backfills ORDER BY created_at").fetchall()]
    assert [(pk, failed) for pk, failed, _ in parked] == [("[3]", True), ("[3]", False)]
    assert [bid for _, _, bid in parked] == order[2:]
    dest.execute("ALTER TABLE mirror.acct DROP CONSTRAINT poison")
    assert main(["--config", str(config.path), "failed", "retry", "--all"]) == 0
    stats = deliver(config, spark)
    assert stats.retried == 2
    assert assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct") == 5
    assert dict(dest.execute("SELECT id, balance FROM mirror.acct"))[3] == 4


def test_a_key_renamed_mid_backfill_parks_its_reads_and_other_groups_flow(source_db, db_factory, write_config, spark):
    """The typed reads hold the key under its old name, the mirror follows the source's new one: those
    reads fail as messages (parked, their groups held), the sink is not wedged, later changes flow."""
    from cdc_pipeline.cli import main

    dest = db_factory()
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, note text);"
                      "INSERT INTO acct SELECT g, 'n' FROM generate_series(1, 3) g")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.acct"],
                                          backoff={"initial_ms": 600_000, "max_ms": 600_000, "jitter": 0}))
    setup(config)
    assert backfill(config, "public.acct").rows_read == 3
    source_db.execute("ALTER TABLE acct RENAME COLUMN id TO acct_id; INSERT INTO acct VALUES (10, 'after')")
    drain(config)
    stats = deliver(config, spark)
    # Delivered: the rename's schema row (the mirror applies it) and the insert after it.
    assert (stats.parked, stats.delivered) == (3, 2)
    assert dest.execute("SELECT acct_id, note FROM mirror.acct") == [(10, "after")]
    with psycopg.connect(config.state_dsn) as conn:
        errors = [r[0] for r in conn.execute("SELECT last_error FROM cdc_pipeline.failed_messages")]
        lag = conn.execute("SELECT count(*) FROM cdc_pipeline.change_log l, cdc_pipeline.sink_offsets o "
                           "WHERE o.sink = 'mirror' AND (l.commit_lsn, l.commit_idx) > (o.commit_lsn, o.commit_idx)"
                           ).fetchone()
    assert len(errors) == 3 and all("do not hold its key" in e for e in errors)
    assert lag == (0,)
    assert main(["--config", str(config.path), "failed", "list"]) == 0


def test_reg_columns_are_not_resolved_in_a_separate_state_database(db_factory, write_config, spark):
    """`regclass`/`regtype` values print as names that only the source's catalog (and a mirror built
    like it) resolves: a state database elsewhere must never parse them (issue 21, suspected)."""
    source, dest, state = db_factory(), db_factory(), db_factory()
    ddl = ("CREATE TYPE mood AS ENUM ('ok'); CREATE TABLE public.regs (id int PRIMARY KEY, rc regclass, "
           "rt regtype, rn regnamespace, ra regclass[]);")
    source.execute(ddl + "CREATE SCHEMA app; CREATE TABLE app.only_here (x int);"
                   "INSERT INTO public.regs VALUES (1, 'app.only_here', 'mood', 'app', '{app.only_here,pg_class}')")
    dest.execute(ddl + "CREATE SCHEMA app; CREATE TABLE app.only_here (x int);")  # the mirror knows the names
    data = backfill_config(source.dsn, dest.dsn, ["public.regs"], {"initial_page_size": 2, "max_page_size": 2})
    data["source"]["slot"] = "cdc_typed_regs"
    data["state"] = {"dsn": state.dsn}
    data["sinks"].append({"name": "appended", "tables": ["public.regs"], "destination": {
        "type": "postgres", "dsn": dest.dsn, "table": "appended.regs", "mode": "append"}})
    config = write_config(data)
    setup(config)
    result = backfill(config, "public.regs")
    assert (result.status, result.rows_read) == ("completed", 1)
    for sink in ("mirror", "appended"):
        stats = deliver(config, spark, sink=sink)
        assert (stats.parked, stats.delivered) == (0, 1), (sink, stats)
    assert assert_mirrored(source.dsn, "public.regs", dest.dsn, "mirror.regs") == 1
    with psycopg.connect(dest.dsn) as conn:
        record = conn.execute("SELECT message->'record' FROM appended.regs").fetchone()[0]
    assert record == {"id": 1, "rc": "app.only_here", "rt": "mood", "rn": "app", "ra": ["app.only_here", "pg_class"]}


def test_json_money_and_oid_alias_columns_keep_the_json_path(source_db: Any) -> None:
    """json (its NUL escapes), money (lc_monetary) and the reg* OID aliases (names only the source's catalog
    resolves), arrays of them too, send the whole table down the JSON path; built-in types and enums do not."""
    from cdc_pipeline.backfill.typed import typed_columns

    kept = ["json", "json[]", "money", "money[]", "regproc", "regprocedure", "regoper", "regoperator", "regclass",
            "regtype[]", "regconfig", "regdictionary", "regnamespace", "regrole", "regcollation"]
    source_db.execute("CREATE TYPE mood AS ENUM ('ok');" + "".join(
        f"CREATE TABLE public.k{i} (id int PRIMARY KEY, v {kind});" for i, kind in enumerate(kept))
        + "CREATE TABLE public.plain (id int PRIMARY KEY, v text[], m mood[])")
    with source_db.connect() as conn:
        for i, kind in enumerate(kept):
            assert typed_columns(conn, "public", f"k{i}", ()) is None, kind
        assert typed_columns(conn, "public", "plain", ()) == (("id", "integer"), ("v", "text[]"), ("m", "text[]"))


def test_typed_reads_into_an_empty_key_range_are_inserted_and_a_taken_key_falls_back_to_merge(db_factory) -> None:
    """A run of typed reads is INSERTed while the mirror holds none of its keys (no MERGE); a key taken, even by
    a transaction still in flight when the INSERT starts, makes the INSERT wait, fail as a whole and the MERGE
    apply the run: no key lost or doubled, the row the writer committed updated by the run as a MERGE does. A
    mirror table without a unique index on its key is always merged (an INSERT could double a key)."""
    import threading
    from dataclasses import replace

    from cdc_pipeline.postgres.catalog import describe_table
    from cdc_pipeline.sinks.postgres import typed

    db = db_factory()
    columns = (("id", "integer"), ("v", "text"))
    plain = typed.PlainInserts()

    def apply(conn: psycopg.Connection, table: str, ids: range, v: str) -> None:
        conn.execute(typed.STAGE_DDL)
        with conn.cursor().copy("COPY _cdc_typed (seq, sch, tbl, shape, tup) FROM STDIN") as copy:
            for seq, i in enumerate(ids):
                copy.write_row((seq, "public", "src", 0, f"({i},{v})"))
        info = describe_table(conn, "public", table)
        assert info is not None
        info = replace(info, primary_key=("id",))  # the source's key, whatever the mirror table has
        typed.apply_run(conn, ("public", table), info, "public", "src", columns, 0, 0, len(ids) - 1, plain)
        conn.commit()

    with psycopg.connect(db.dsn) as conn, psycopg.connect(db.dsn) as writer:
        conn.execute("CREATE TABLE public.m (id integer PRIMARY KEY, v text)")
        conn.commit()
        conn.execute(typed.STAGE_DDL)
        apply(conn, "m", range(1, 6), "r1")
        assert plain._merge_for == {}  # inserted: no fallback
        # A writer holds key 8 uncommitted: the run's INSERT waits on it, then fails; the MERGE applies the run.
        writer.execute("INSERT INTO public.m VALUES (8, 'writer')")
        done = threading.Event()
        worker = threading.Thread(target=lambda: (apply(conn, "m", range(6, 11), "r2"), done.set()))
        worker.start()
        wait_until(lambda: db.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")[0][0] > 0, 30,
                   "the run's INSERT to wait for the writer's key")
        writer.commit()
        worker.join(60)
        assert done.is_set()
        assert plain._merge_for == {("public", "m"): typed.PlainInserts.BACKOFF_RUNS}
        assert db.execute("SELECT id, v FROM public.m ORDER BY id") == [
            *[(i, "r1") for i in range(1, 6)], *[(i, "r2") for i in range(6, 11)]]
        plain._merge_for.clear()
        conn.execute("CREATE TABLE public.nokey (id integer, v text)")
        conn.execute("INSERT INTO public.nokey VALUES (1, 'old')")
        conn.commit()
        apply(conn, "nokey", range(1, 3), "r3")  # no unique index on the key: merged, key 1 not doubled
        assert db.execute("SELECT id, v FROM public.nokey ORDER BY id") == [(1, "r3"), (2, "r3")]
        assert plain._merge_for == {}


def test_a_run_copied_into_an_empty_key_range_is_its_composite_text_cast_or_nothing(db_factory) -> None:
    """The fast path of a run (typed.copy_run): composite texts relayed as COPY text and COPYed into the mirror
    table as CSV give exactly the rows their cast to the row type gives (every type, quotes, backslashes,
    tabs, newlines, NULL and ''), in one block or one block per row. A key already there, a key twice in the
    run, or a key a concurrent writer is inserting makes it write nothing (its savepoint), a mirror table
    that lacks a column of the reads or has another type for one is not copied to, and one with a column
    of its own is (that column takes its default)."""
    import threading
    from dataclasses import replace

    from cdc_pipeline.backfill.typed import typed_columns
    from cdc_pipeline.postgres.catalog import describe_table
    from cdc_pipeline.sinks.postgres import typed

    db = db_factory()
    db.execute(DDL)
    db.execute(ROWS)
    with db.connect() as conn:
        columns = typed_columns(conn, "public", "typed", ())
        assert columns is not None
        body = ", ".join(f'"{c}" {t}' for c, t in columns)
        conn.execute(f"CREATE TABLE public.m ({body}, PRIMARY KEY (id)); CREATE TABLE public.expected ({body})")
        conn.execute("CREATE TABLE public.log AS SELECT ROW(t.*)::text AS tup FROM public.typed t ORDER BY id")
        conn.execute("INSERT INTO public.expected SELECT (tup::public.expected).* FROM public.log")
        with conn.cursor().copy("COPY (SELECT tup FROM public.log) TO STDOUT") as copy:
            rows = [bytes(d) for d in copy]
    same = ("SELECT (SELECT count(*) FROM (SELECT * FROM public.m EXCEPT SELECT * FROM public.expected) a), "
            "(SELECT count(*) FROM (SELECT * FROM public.expected EXCEPT SELECT * FROM public.m) b)")
    with psycopg.connect(db.dsn) as conn, psycopg.connect(db.dsn) as writer:
        for blocks in ([b"".join(rows)], rows):
            conn.execute("TRUNCATE public.m")
            assert typed.copy_run(conn, ("public", "m"), columns, blocks) == 3
            assert conn.execute(same).fetchone() == (0, 0)
        conn.commit()
        twice = [rows[1], rows[2], rows[1]]
        conn.execute("DELETE FROM public.m WHERE id <> 1")
        for blocks in ([rows[1], rows[0]], twice):  # key 1 there already; key 2 twice
            assert typed.copy_run(conn, ("public", "m"), columns, blocks) is None
            assert conn.execute("SELECT array_agg(id) FROM public.m").fetchone() == ([1],)  # nothing written
        conn.commit()
        writer.execute("INSERT INTO public.m (id) VALUES (3)")  # in flight while the run is copied
        result: list[int | None] = []
        worker = threading.Thread(target=lambda: result.append(typed.copy_run(conn, ("public", "m"), columns,
                                                                               [rows[1], rows[2]])))
        worker.start()
        wait_until(lambda: db.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")[0][0] > 0, 30,
                   "the run's COPY to wait for the writer's key")
        writer.commit()
        worker.join(60)
        assert result == [None]
        conn.rollback()
        info = describe_table(conn, "public", "m")
        assert info is not None and typed.copyable(info, columns, "public", "typed")
        lacking = replace(info, columns=tuple(c for c in info.columns if c.name != "big"))
        other_type = replace(info, columns=tuple(replace(c, type_sql="text") if c.name == "i4" else c
                                                 for c in info.columns))
        assert not typed.copyable(lacking, columns, "public", "typed")
        assert not typed.copyable(other_type, columns, "public", "typed")
        with pytest.raises(typed.TypedMismatch):
            typed.copyable(info, columns[1:], "public", "typed")
        # A column the reads do not have (the mirror's own) takes its default, as the INSERT gives it.
        conn.execute("ALTER TABLE public.m ADD COLUMN extra text DEFAULT 'd'; TRUNCATE public.m")
        info = describe_table(conn, "public", "m")
        assert info is not None and typed.copyable(info, columns, "public", "typed")
        assert typed.copy_run(conn, ("public", "m"), columns, rows) == 3
        assert conn.execute("SELECT array_agg(extra) FROM public.m").fetchone() == (["d", "d", "d"],)


def test_a_typed_run_into_a_partly_filled_mirror_falls_back_to_the_merge(db_factory, write_config, spark,
                                                                        monkeypatch) -> None:
    """A run of typed reads into an empty mirror is COPYed into it; a second backfill's run, whose keys the
    mirror partly holds (one deleted, one changed behind the pipeline's back), cannot be: it is relayed
    again and merged, and the mirror ends equal to the source with the sink's position at the log's end."""
    from cdc_pipeline.sinks.postgres import typed

    source, dest = db_factory(), db_factory()
    source.execute(DDL)
    source.execute(ROWS)
    config = _config(source, dest, write_config, slot="cdc_typed_partly")
    copied: list[int | None] = []
    original = typed.copy_run

    def spy(*args: Any) -> int | None:
        copied.append(original(*args))
        return copied[-1]

    monkeypatch.setattr(typed, "copy_run", spy)
    answers, calls = _spy_typed_batches(monkeypatch)
    backfill(config, "public.typed", sinks=("mirror",))
    deliver(config, spark, sink="mirror")
    assert (copied, answers, calls) == ([3], [None], [])
    dest.execute("DELETE FROM mirror.typed WHERE id = 1; UPDATE mirror.typed SET t = 'stale' WHERE id = 2")
    backfill(config, "public.typed", sinks=("mirror",))
    deliver(config, spark, sink="mirror")
    assert (copied, answers, calls) == ([3, None], [None, None], [])
    assert assert_mirrored(source.dsn, "public.typed", dest.dsn, "mirror.typed") == 3
    with psycopg.connect(config.state_dsn) as conn, psycopg.connect(dest.dsn) as dconn:
        last = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log "
                            "ORDER BY commit_lsn DESC, commit_idx DESC LIMIT 1").fetchone()
        mine = dconn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline_sink.offsets "
                             "WHERE sink = 'mirror'").fetchone()
    assert last is not None and mine == last


def test_a_run_read_off_the_reconciled_pages_is_the_scanned_run_or_none(db_factory) -> None:
    """``page_run`` finds the run at the head of a sink's log from its pages' position ranges: the run the scan
    (``head_run``) finds, or a shorter one (a change between two pages ends it after the first), or none when
    the range holds anything but those pages' typed reads (a JSON page) or the offset is inside a page with
    dropped reads. Pages: A at 100 (10 reads), B at 200 (10 positions, 2 dropped), a change of the table
    at 150 between them, another table's change at 250, C at 300 (10 reads, JSON)."""
    from cdc_pipeline.state import typed_log
    from cdc_pipeline.state.change_log import ChangeLog
    from cdc_pipeline.state.schema import ensure_schema

    db = db_factory()
    tables, s = ["public.t"], "cdc_pipeline"
    with psycopg.connect(db.dsn) as conn:
        ensure_schema(conn, s)
        conn.execute("INSERT INTO cdc_pipeline.backfills (id, mac_key, identity, table_schema, table_name, sinks, "
                     "primary_key, keyset, typed_type, typed_columns) VALUES ('b1', 'k', 'i', 'public', 't', "
                     "'{mirror}', '{id}', '{id}', 'x', '[[\"id\", \"integer\"]]')")
        for page, (lsn, dropped) in enumerate([(100, 0), (200, 2), (300, 0)]):
            conn.execute("INSERT INTO cdc_pipeline.backfill_pages (backfill_id, page_no, snapshot, read_at, page_size, "
                         "rows, read_ms, last, status, dropped, high_lsn, high_idx) VALUES ('b1', %s, '', now(), 10, "
                         "10, 1, false, 'reconciled', %s, %s, 0)", (page, dropped, lsn))
        log = ("INSERT INTO cdc_pipeline.change_log (commit_lsn, commit_idx, table_schema, table_name, action, "
               "commit_ts, backfill_id, tup) SELECT %s, i, %s, 't', %s, now(), %s, %s FROM generate_series(%s::int, %s::int) i")
        conn.execute(log, (100, "public", "read", "b1", "(1)", 0, 9))
        conn.execute(log, (150, "public", "update", None, None, 0, 0))
        conn.execute(log, (200, "public", "read", "b1", "(1)", 0, 3))
        conn.execute(log, (200, "public", "read", "b1", "(1)", 6, 9))  # 4 and 5 dropped
        conn.execute(log, (250, "other", "insert", None, None, 0, 0))
        conn.execute(log, (300, "public", "read", "b1", None, 0, 9))  # a JSON page
        conn.commit()

        def runs(after: tuple[int, int], limit: int) -> tuple[Any, Any]:
            page = typed_log.page_run(conn, s, tables, "mirror", after, limit)
            scan = typed_log.head_run(conn, s, ChangeLog(s).routing("mirror"), (tables, "mirror"), after, limit)
            conn.rollback()
            return (None if page is None else (page.count, page.last, page.tables)), (scan.count, scan.last)

        table = (("public", "t"),)
        assert runs((0, -1), 100) == ((10, (100, 9), table), (10, (100, 9)))  # the change at 150 ends it
        assert runs((0, -1), 4) == ((4, (100, 3), table), (4, (100, 3)))
        assert runs((100, 4), 100) == ((5, (100, 9), table), (5, (100, 9)))
        assert runs((150, 0), 100) == ((8, (200, 9), table), (8, (200, 9)))  # the other table's change ends it
        assert runs((150, 0), 5) == (None, (5, (200, 6)))  # a cut inside a page with dropped reads
        assert runs((200, 1), 100) == (None, (6, (200, 9)))  # the offset inside a page with dropped reads
        assert runs((250, 0), 100)[0] is None  # a JSON page
