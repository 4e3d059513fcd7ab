"""Bad input through the real console script: each mistake gives one clear message naming the problem and
a non-zero exit, for `check` and for `setup`, and nothing is created (no slot, publication or state
schema) in the source."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from cdc_pipeline.postgres import embedded
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config

CLI = str(Path(sys.executable).with_name("cdc-pipeline"))


@pytest.fixture(scope="module")
def replica_cluster() -> Iterator[embedded.EmbeddedPostgres]:
    """A throwaway cluster running with wal_level=replica (the tests must not depend on the machine's own
    PostgreSQL service)."""
    cluster = embedded.create()
    cluster.start(durable=False)
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_level = replica")
        cluster.stop()
        cluster.start(durable=False)
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            row = conn.execute("SHOW wal_level").fetchone()
            assert row == ("replica",)
            conn.execute("CREATE DATABASE src")
        yield cluster
    finally:
        cluster.destroy()


def run(config_path: Path, verb: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = subprocess.run([CLI, "--config", str(config_path), verb], capture_output=True, text=True,
                          timeout=60, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def created(dsn: str) -> list[str]:
    """What `setup` would have made in this database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        slots = conn.execute("SELECT 'slot ' || slot_name FROM pg_replication_slots "
                             "WHERE database = current_database()").fetchall()
        pubs = conn.execute("SELECT 'publication ' || pubname FROM pg_publication").fetchall()
        schemas = conn.execute("SELECT 'schema ' || nspname FROM pg_namespace "
                               "WHERE nspname LIKE 'cdc_pipeline%'").fetchall()
    return [r[0] for r in slots + pubs + schemas]


def write(path: Path, data: dict[str, Any] | str) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one message line, got:\n{text}"
    return lines[0]


VERBS = ["check", "setup"]


# -- config errors: reported before connecting anywhere ------------------------------------------------

@pytest.mark.parametrize("verb", VERBS)
def test_malformed_yaml(verb: str, source_db: Database, tmp_path: Path) -> None:
    path = write(tmp_path / "cdc.yaml", f'source: {{dsn: "{source_db.dsn}"\ntables: [\n  - name: public.t\n')
    rc, out, err = run(path, verb)
    assert rc != 0
    line = one_line(err)
    assert str(path) in line and "YAML syntax error" in line and "line 2" in line, line
    assert out == ""
    assert created(source_db.dsn) == []


@pytest.mark.parametrize("verb", VERBS)
def test_unknown_key(verb: str, source_db: Database, tmp_path: Path) -> None:
    data = mirror_config(source_db.dsn, source_db.dsn, ["public.t"])
    data["sinks"][0]["destination"]["tabel"] = "x.y"
    path = write(tmp_path / "cdc.yaml", data)
    rc, out, err = run(path, verb)
    assert rc != 0
    line = one_line(err)
    assert str(path) in line and "sinks[0].destination" in line and "unknown key 'tabel'" in line, line
    assert created(source_db.dsn) == []


@pytest.mark.parametrize("verb", VERBS)
def test_missing_environment_variable(verb: str, source_db: Database, tmp_path: Path) -> None:
    data = mirror_config("${CDC_TEST_UNSET_SOURCE_DSN}", source_db.dsn, ["public.t"])
    path = write(tmp_path / "cdc.yaml", data)
    env = {k: v for k, v in os.environ.items() if k != "CDC_TEST_UNSET_SOURCE_DSN"}
    rc, out, err = run(path, verb, env=env)
    assert rc != 0
    line = one_line(err)
    assert str(path) in line and "source.dsn" in line and "CDC_TEST_UNSET_SOURCE_DSN" in line \
        and "not set" in line, line
    assert created(source_db.dsn) == []


# -- source problems: found by connecting, before creating anything ------------------------------------

@pytest.mark.parametrize("verb", VERBS)
def test_table_without_primary_key(verb: str, source_db: Database, tmp_path: Path) -> None:
    source_db.execute("CREATE TABLE keyed (id int PRIMARY KEY); CREATE TABLE nokey (id int, v text)")
    path = write(tmp_path / "cdc.yaml", mirror_config(source_db.dsn, source_db.dsn, ["public.keyed", "public.nokey"]))
    rc, out, err = run(path, verb)
    assert rc != 0
    if verb == "check":  # one finding per line; the problem's line names the table and the fix
        errors = [line for line in out.splitlines() if line.startswith("ERROR")]
        problem = [line for line in errors if "public.nokey" in line]
        assert len(problem) == 1 and "no primary key" in problem[0] and "ADD PRIMARY KEY" in problem[0], out
        assert not any("public.keyed" in line for line in errors), out
        assert err == ""
    else:
        line = one_line(err)
        assert "public.nokey" in line and "no primary key" in line, line
    assert created(source_db.dsn) == []


@pytest.mark.parametrize("verb", VERBS)
def test_source_with_wal_level_replica(verb: str, replica_cluster: embedded.EmbeddedPostgres,
                                       db_factory: Callable[[], Database], tmp_path: Path) -> None:
    src = replica_cluster.dsn("src")
    with psycopg.connect(src, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY)")
    dest: Database = db_factory()
    path = write(tmp_path / "cdc.yaml", mirror_config(src, dest.dsn, ["public.t"]))
    rc, out, err = run(path, verb)
    assert rc != 0
    text = out if verb == "check" else err
    problem = [line for line in text.splitlines() if "wal_level" in line]
    assert len(problem) == 1 and "'replica'" in problem[0] and "logical" in problem[0], text
    if verb == "setup":
        one_line(err)
    assert created(src) == []
    assert created(dest.dsn) == []


def test_unreachable_state_database_leaves_no_slot(source_db: Database, tmp_path: Path) -> None:
    """setup reaches the state database before it creates anything in the source: a slot left behind by
    a failed setup would hold the source's WAL for good."""
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    data = mirror_config(source_db.dsn, source_db.dsn, ["public.t"])
    data["state"] = {"dsn": source_db.dsn.replace(f"dbname={source_db.name}", "dbname=cdc_no_such_database")}
    path = write(tmp_path / "cdc.yaml", data)
    rc, out, err = run(path, "setup")
    assert rc != 0
    line = one_line(err)
    assert "state" in line and "cdc_no_such_database" in line and "does not exist" in line, line
    assert created(source_db.dsn) == []


def test_nothing_was_left_half_done_then_setup_works(source_db: Database, tmp_path: Path) -> None:
    """After the failures above are fixed, the same config sets up cleanly (the failures left no debris
    that would make setup or check trip later)."""
    source_db.execute("CREATE TABLE nokey (id int, v text)")
    path = write(tmp_path / "cdc.yaml", mirror_config(source_db.dsn, source_db.dsn, ["public.nokey"]))
    assert run(path, "setup")[0] != 0
    assert created(source_db.dsn) == []
    source_db.execute("ALTER TABLE nokey ADD PRIMARY KEY (id)")
    rc, out, err = run(path, "setup")
    assert rc == 0, err
    assert sorted(created(source_db.dsn)) == ["publication cdc_test", "schema cdc_pipeline", "slot cdc_test"]
    rc, out, err = run(path, "check")
    assert rc == 0, out + err
    assert out.strip().splitlines()[-1].startswith("OK"), out



@pytest.mark.parametrize("where", ["before the verb", "after the verb", "environment"])
def test_config_path_before_or_after_the_verb_or_from_the_environment(where: str, source_db: Database,
                                                                       tmp_path: Path) -> None:
    import os

    data = mirror_config(source_db.dsn, source_db.dsn, ["public.t"])
    data["sinks"][0]["destination"]["tabel"] = "x.y"
    path = write(tmp_path / "cdc.yaml", data)
    args = {"before the verb": ["--config", str(path), "check"], "after the verb": ["check", "--config", str(path)],
            "environment": ["check"]}[where]
    env = dict(os.environ, CDC_CONFIG=str(path)) if where == "environment" else None
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert str(path) in proc.stderr and "unknown key 'tabel'" in proc.stderr
