"""Shared fixtures: a real PostgreSQL with wal_level=logical, a real Spark session, config files.

PostgreSQL: the cluster named by CDC_TEST_PG_DSN (must have wal_level=logical and allow CREATE
DATABASE), else a throwaway cluster this session starts and removes. Every test gets its own database.
A test marked `pg_matrix` runs on every major version of `pg_versions.selected_majors()` (see pg_versions).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import conninfo, sql

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.postgres import embedded
from cdc_pipeline_tests import pg_versions


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    external = os.environ.get("CDC_TEST_PG_DSN")
    if external:
        yield external
        return
    cluster = embedded.create()
    cluster.start(durable=False)
    try:
        yield cluster.dsn()
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def pg_clusters(pg_admin_dsn: str) -> Iterator[pg_versions.Clusters]:
    clusters = pg_versions.Clusters(pg_admin_dsn)
    try:
        yield clusters
    finally:
        clusters.close()


@pytest.fixture(scope="session")
def pg_major() -> int | None:
    """The major version a `pg_matrix` test runs on (parametrized per module); None: the session's cluster."""
    return None


@pytest.fixture(scope="module")
def pg_server(pg_major: int | None, pg_clusters: pg_versions.Clusters) -> str:
    """Admin DSN of the cluster this test's databases live on."""
    return pg_clusters.admin_dsn(pg_major)


@pytest.fixture(scope="module")
def pg_dest_server(pg_major: int | None, pg_server: str, pg_clusters: pg_versions.Clusters) -> str:
    """Admin DSN for destination databases: the test's cluster, except on a version whose server cannot be
    the Postgres sink's destination (its MERGE needs 15+): there the session's cluster."""
    major = pg_clusters.default_major if pg_major is None else pg_major
    return pg_server if major >= pg_versions.MIN_DESTINATION_MAJOR else pg_clusters.default_dsn


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pg_matrix: runs once per PostgreSQL major version (CDC_TEST_PG_VERSIONS), id [pgNN]")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("pg_matrix"):
        majors = pg_versions.selected_majors()
        # Module scope: a module's fixtures built on `pg_server` (a shared source, a cluster of its own)
        # are made once per version, and the tests run grouped by version.
        metafunc.parametrize("pg_major", majors, ids=[f"pg{m}" for m in majors], scope="module")


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"pg_matrix versions: {pg_versions.selected_majors()} (CDC_TEST_PG_VERSIONS); "
            f"other tests on the session cluster ({embedded.PG_BIN} or CDC_TEST_PG_DSN)"]


class Database:
    def __init__(self, admin_dsn: str, name: str) -> None:
        self.name = name
        self.dsn = conninfo.make_conninfo(admin_dsn, dbname=name)
        self.admin_dsn = admin_dsn

    def connect(self, **kw: Any) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True, **kw)

    def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []


def _drop(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                                    (name,)).fetchall():
            _drop_slot(conn, slot)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _drop_slot(conn: psycopg.Connection, slot: str, timeout_s: float = 60.0) -> None:
    """Drop a slot whose walsender may still be exiting: a terminated backend releases its slot only once
    it is gone, which on a loaded machine is after the terminate call returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        # The timeout form (PostgreSQL 14+) waits for the backend to exit.
        conn.execute("SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots "
                     "WHERE slot_name = %s AND active_pid IS NOT NULL", (slot,))
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise


def _database_factory(server: str, made: list[str]) -> Callable[..., Database]:
    def make(encoding: str | None = None) -> Database:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server, autocommit=True) as conn:
            if encoding is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            else:  # another encoding needs the C locale and template0
                conn.execute(sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
                             .format(sql.Identifier(name), sql.Literal(encoding)))
        made.append(name)
        return Database(server, name)

    return make


@pytest.fixture
def db_factory(pg_dest_server: str) -> Iterator[Callable[..., Database]]:
    """Databases for destinations (and separate state): on the test's cluster (see `pg_dest_server`)."""
    made: list[str] = []
    yield _database_factory(pg_dest_server, made)
    for name in made:
        _drop(pg_dest_server, name)


@pytest.fixture
def source_db(pg_server: str) -> Iterator[Database]:
    """The source database, on the test's cluster (of the `pg_matrix` version)."""
    made: list[str] = []
    yield _database_factory(pg_server, made)()
    for name in made:
        _drop(pg_server, name)


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., PipelineConfig]:
    """Write a cdc.yaml from a dict and load it through the real loader."""

    def write(data: dict[str, Any], name: str = "cdc.yaml") -> PipelineConfig:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return load_config(path)

    return write


@pytest.fixture(scope="session")
def spark() -> Any:
    from cdc_pipeline.config import SparkConfig
    from cdc_pipeline.delivery.spark_stage import spark_session

    return spark_session(SparkConfig(master="local[2]"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """On CI a skipped test is a failed test: never go green by skipping."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if os.environ.get("CI") and skipped and exitstatus == 0:
        session.exitstatus = 1
        if reporter:
            reporter.write_line(f"CI: {len(skipped)} skipped test(s) count as failures", red=True)
