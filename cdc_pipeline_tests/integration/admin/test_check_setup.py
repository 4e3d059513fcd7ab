"""`cdc-pipeline check` as a preflight: on a ready source before `setup` it exits 0 and lists what setup will
create; it exits 1 only for what blocks capture, each finding on one line with the fix (issues 8.3, 9.4)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config
from cdc_pipeline_tests.integration.admin.test_cli_errors import CLI, created, run


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def lines(out: str, level: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(level.upper())]


def test_check_before_setup_lists_what_setup_creates_and_exits_0(source_db: Database, tmp_path: Path) -> None:
    source_db.execute("CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (id int PRIMARY KEY)")
    path = write(tmp_path / "cdc.yaml", mirror_config(source_db.dsn, source_db.dsn, ["public.a", "public.b"]))
    rc, out, err = run(path, "check")
    assert rc == 0, out + err
    assert lines(out, "error") == [], out
    todo = lines(out, "todo")
    assert any("publication" in t and "cdc_test" in t and "setup" in t for t in todo), out
    assert any("slot" in t and "cdc_test" in t and "setup" in t for t in todo), out
    assert any("state" in t and "cdc_pipeline" in t and "setup" in t for t in todo), out
    assert out.strip().splitlines()[-1].startswith("OK"), out
    assert created(source_db.dsn) == []  # check creates nothing

    # The preflight chains: `check && setup`.
    proc = subprocess.run(f"'{CLI}' --config '{path}' check && '{CLI}' --config '{path}' setup", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(created(source_db.dsn)) == ["publication cdc_test", "schema cdc_pipeline", "slot cdc_test"]
    rc, out, err = run(path, "check")
    assert rc == 0 and lines(out, "todo") == [], out

    # A table added to the config later: the publication lacks it, which setup fixes.
    source_db.execute("CREATE TABLE c (id int PRIMARY KEY)")
    path = write(tmp_path / "cdc.yaml", mirror_config(source_db.dsn, source_db.dsn,
                                                     ["public.a", "public.b", "public.c"]))
    rc, out, err = run(path, "check")
    assert rc == 0, out
    assert [t for t in lines(out, "todo") if "public.c" in t and "publication" in t], out
    assert run(path, "setup")[0] == 0
    assert source_db.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'cdc_test' "
                             "ORDER BY 1") == [("a",), ("b",), ("c",)]


def test_what_blocks_capture_exits_1_with_the_fix(source_db: Database, tmp_path: Path) -> None:
    source_db.execute(
        # replica identity on a unique index that is not the key: deletes would carry no primary key
        "CREATE TABLE byindex (id int PRIMARY KEY, code text NOT NULL UNIQUE, v text);"
        "ALTER TABLE byindex REPLICA IDENTITY USING INDEX byindex_code_key;"
        # an identity index that contains the key is fine
        "CREATE TABLE covering (id int PRIMARY KEY, code text NOT NULL, UNIQUE (code, id));"
        "ALTER TABLE covering REPLICA IDENTITY USING INDEX covering_code_id_key;"
        "CREATE TABLE nothing (id int PRIMARY KEY); ALTER TABLE nothing REPLICA IDENTITY NOTHING;"
        # group_columns a delete does not carry (DEFAULT identity: the key only) ...
        "CREATE TABLE grouped (id int PRIMARY KEY, account int NOT NULL);"
        # ... and the same with FULL, which carries them
        "CREATE TABLE grouped_full (id int PRIMARY KEY, account int NOT NULL);"
        "ALTER TABLE grouped_full REPLICA IDENTITY FULL;")
    tables = ["public.byindex", "public.covering", "public.nothing", {"name": "public.grouped",
              "group_columns": ["account"]}, {"name": "public.grouped_full", "group_columns": ["account"]}]
    path = write(tmp_path / "cdc.yaml", mirror_config(source_db.dsn, source_db.dsn, tables))
    rc, out, err = run(path, "check")
    assert rc == 1, out + err
    errors = lines(out, "error")
    by_table = {t: [e for e in errors if f"public.{t}:" in e] for t in
                ("byindex", "covering", "nothing", "grouped", "grouped_full")}
    assert len(by_table["byindex"]) == 1, out
    assert "REPLICA IDENTITY USING INDEX" in by_table["byindex"][0] and "(code)" in by_table["byindex"][0]
    assert "REPLICA IDENTITY DEFAULT" in by_table["byindex"][0], out
    assert len(by_table["nothing"]) == 1 and "REPLICA IDENTITY DEFAULT" in by_table["nothing"][0], out
    assert len(by_table["grouped"]) == 1, out
    assert "account" in by_table["grouped"][0] and "REPLICA IDENTITY FULL" in by_table["grouped"][0], out
    assert by_table["covering"] == [] and by_table["grouped_full"] == [], out
    # the publication, slot and state schema are still only todo: the errors are the tables
    assert len(errors) == 3, out
    # setup refuses the same config and creates nothing
    rc, out, err = run(path, "setup")
    assert rc != 0 and "byindex" in err and "REPLICA IDENTITY" in err, err
    assert created(source_db.dsn) == []


def test_a_publication_that_drops_deletes_is_an_error(source_db: Database, tmp_path: Path) -> None:
    source_db.execute("CREATE TABLE a (id int PRIMARY KEY); "
                      "CREATE PUBLICATION cdc_test FOR TABLE a WITH (publish = 'insert, update')")
    path = write(tmp_path / "cdc.yaml", mirror_config(source_db.dsn, source_db.dsn, ["public.a"]))
    rc, out, err = run(path, "check")
    assert rc == 1, out
    problem = [e for e in lines(out, "error") if "publication" in e]
    assert len(problem) == 1 and "delete" in problem[0] and "ALTER PUBLICATION" in problem[0], out


def test_a_slot_of_another_database_is_an_error(source_db: Database, db_factory, tmp_path: Path) -> None:
    """pg_replication_slots is cluster-wide: a slot of that name in another database is not ours (setup
    would skip creating it and the drain could not stream it)."""
    other = db_factory()
    other.execute("SELECT pg_create_logical_replication_slot('cdc_test', 'pgoutput')")
    source_db.execute("CREATE TABLE a (id int PRIMARY KEY)")
    path = write(tmp_path / "cdc.yaml", mirror_config(source_db.dsn, source_db.dsn, ["public.a"]))
    rc, out, err = run(path, "check")
    assert rc == 1, out
    problem = [e for e in lines(out, "error") if e.startswith("ERROR   slot:")]
    assert len(problem) == 1 and other.name in problem[0] and "source.slot" in problem[0], out


def test_a_money_column_bound_for_a_mirror_is_a_warning_that_names_lc_monetary(source_db: Database,
                                                                                tmp_path: Path) -> None:
    """money prints by lc_monetary: a mirror holds it exactly only with the same setting (issue 20)."""
    source_db.execute("CREATE TABLE prices (id int PRIMARY KEY, p money, ps money[], n numeric)")
    path = write(tmp_path / "cdc.yaml", mirror_config(source_db.dsn, source_db.dsn, ["public.prices"]))
    rc, out, err = run(path, "check")
    assert rc == 0, out + err
    warned = [w for w in lines(out, "warning") if "public.prices" in w and "lc_monetary" in w]
    assert len(warned) == 2 and "'p'" in warned[0] and "'ps'" in warned[1], out
    assert not [w for w in lines(out, "warning") if "'n'" in w], out
