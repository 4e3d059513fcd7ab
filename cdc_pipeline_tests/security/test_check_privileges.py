"""`check` as a non-superuser source role (the rest of the suite connects as a superuser): a role without
REPLICATION, and one that may not read a published table, each get their finding with the fix from the
real console script, and the missing REPLICATION fails the check."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg import conninfo, sql

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config
from cdc_pipeline_tests.integration.admin.test_check_setup import lines, write
from cdc_pipeline_tests.integration.admin.test_cli_errors import run


@pytest.fixture
def role(source_db: Database) -> Iterator[str]:
    """A LOGIN role that is no superuser and has no REPLICATION; dropped afterwards (roles are cluster-wide)."""
    name = f"cdc_plain_{uuid.uuid4().hex[:8]}"
    source_db.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw' NOSUPERUSER NOREPLICATION").format(
        sql.Identifier(name)).as_string())
    yield name
    source_db.execute(sql.SQL("DROP OWNED BY {}; DROP ROLE {}").format(
        sql.Identifier(name), sql.Identifier(name)).as_string())


def _check_as(source_db: Database, role: str, tmp_path: Path) -> tuple[int, str]:
    dsn = conninfo.make_conninfo(source_db.dsn, user=role, password="pw")
    path = write(tmp_path / f"{role}.yaml", mirror_config(dsn, source_db.dsn, ["public.a", "public.b"]))
    rc, out, err = run(path, "check")
    return rc, out + err


def test_check_reports_missing_replication_and_select_as_a_plain_role(source_db: Database, role: str,
                                                                     write_config, tmp_path: Path) -> None:
    source_db.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
    setup(write_config(mirror_config(source_db.dsn, source_db.dsn, ["public.a", "public.b"])))
    ident = sql.Identifier(role)
    source_db.execute(sql.SQL("GRANT USAGE ON SCHEMA cdc_pipeline TO {}; "
                              "GRANT ALL ON ALL TABLES IN SCHEMA cdc_pipeline TO {}; "
                              "GRANT SELECT ON public.a TO {}").format(ident, ident, ident).as_string())

    # Neither REPLICATION nor SELECT on public.b: both named with their fix, and capture is blocked.
    rc, out = _check_as(source_db, role, tmp_path)
    assert rc == 1, out
    assert [x for x in lines(out, "error") if "REPLICATION" in x and "ALTER ROLE" in x], out
    assert [x for x in lines(out, "warning") if "public.b" in x and "GRANT SELECT ON public.b" in x], out
    assert not [x for x in out.splitlines() if "public.a" in x and "GRANT SELECT" in x], out

    # With REPLICATION the blocking error goes; the unreadable table is still reported.
    source_db.execute(sql.SQL("ALTER ROLE {} REPLICATION").format(ident).as_string())
    rc, out = _check_as(source_db, role, tmp_path)
    assert not [x for x in out.splitlines() if "REPLICATION" in x], out
    assert [x for x in lines(out, "warning") if "GRANT SELECT ON public.b" in x], out
    assert rc == 0, out  # a warning: the drain works without SELECT, backfills of public.b fail

    # Granted everything the drain and backfills need: no privilege finding remains.
    source_db.execute(sql.SQL("GRANT SELECT ON public.b TO {}").format(ident).as_string())
    rc, out = _check_as(source_db, role, tmp_path)
    assert not [x for x in out.splitlines() if "GRANT SELECT" in x or "REPLICATION" in x], out
