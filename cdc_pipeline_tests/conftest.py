"""Shared fixtures: a real PostgreSQL with wal_level=logical, a real Spark session, config files.

PostgreSQL: the cluster named by CDC_TEST_PG_DSN (must have wal_level=logical and allow CREATE
DATABASE), else a throwaway cluster this session starts and removes. Every test gets its own database.
"""

from __future__ import annotations

import os
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
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                         "WHERE slot_name = %s AND active_pid IS NOT NULL", (slot,))
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db_factory(pg_admin_dsn: str) -> Iterator[Callable[..., Database]]:
    made: list[str] = []

    def make(encoding: str | None = None) -> Database:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            if encoding is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            else:  # another encoding needs the C locale and template0
                conn.execute(sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
                             .format(sql.Identifier(name), sql.Literal(encoding)))
        made.append(name)
        return Database(pg_admin_dsn, name)

    yield make
    for name in made:
        _drop(pg_admin_dsn, name)


@pytest.fixture
def source_db(db_factory: Callable[[], Database]) -> Database:
    return db_factory()


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
