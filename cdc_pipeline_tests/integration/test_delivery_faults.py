"""A long-running delivery rides through a restart of the state database and of the mirror database, and
through the mirror ending its session: the same Deliverer keeps running, and the mirror ends equal to the
source row for row.

The state database and the mirror live on a cluster of their own that the test restarts
(`pg_ctl restart -m fast`); the source lives on the session's shared cluster.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cdc_pipeline import status
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.engine import Deliverer, DeliveryStats
from cdc_pipeline.postgres import embedded
from cdc_pipeline.setup import setup
from cdc_pipeline_tests.conftest import Database, _drop
from cdc_pipeline_tests.helpers import assert_mirrored, drain, mirror_config
from cdc_pipeline_tests.integration.test_delivery_outage import Background, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[embedded.EmbeddedPostgres]:
    pg = embedded.create()
    pg.start(durable=False)
    try:
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def remote(cluster: embedded.EmbeddedPostgres) -> Iterator[tuple[Database, Database]]:
    """(state database, mirror database) on the restartable cluster."""
    names = [f"s_{uuid.uuid4().hex[:12]}", f"m_{uuid.uuid4().hex[:12]}"]
    for name in names:
        cluster.create_database(name)
    yield Database(cluster.dsn(), names[0]), Database(cluster.dsn(), names[1])
    for name in names:
        _drop(cluster.dsn(), name)


def _restart(cluster: embedded.EmbeddedPostgres) -> None:
    cluster._run(str(embedded.PG_BIN / "pg_ctl"), "-D", str(cluster.data_dir), "-l", str(cluster.root / "postgres.log"),
                 "-o", f"-p {cluster.port}", "-m", "fast", "-w", "-t", "60", "restart")


def _offset(config: PipelineConfig) -> str | None:
    try:
        return str(status.collect(config)["sinks"]["mirror"]["offset"])
    except psycopg.Error:
        return None  # the state database is restarting


def _caught_up(config: PipelineConfig) -> bool:
    try:
        sink = status.collect(config)["sinks"]["mirror"]
    except psycopg.Error:
        return False
    return sink["lag_messages"] == 0 and sink["parked"] == 0


def _write(source: Database, lo: int, hi: int, v: int) -> None:
    source.execute("INSERT INTO acct SELECT g, %s FROM generate_series(%s::int, %s::int) g "
                   "ON CONFLICT (id) DO UPDATE SET balance = excluded.balance", (v, lo, hi))
    source.execute("UPDATE acct SET balance = balance + 1 WHERE id % 3 = 0")
    source.execute("DELETE FROM acct WHERE id %% 11 = %s", (v % 11,))


def test_deliver_rides_through_state_and_mirror_restarts(
        source_db: Database, remote: tuple[Database, Database], cluster: embedded.EmbeddedPostgres,
        write_config: Callable[..., PipelineConfig], spark: Any) -> None:
    state, dest = remote
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance int)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.acct"], target="mirror.acct", batch_size=300)
    data["state"] = {"dsn": state.dsn}
    data["delivery"] = {"idle_seconds": 0.1, "retry_initial_ms": 200, "retry_max_ms": 1000}
    config = write_config(data)
    setup(config)
    for v in range(3):
        _write(source_db, 1, 3000, v)
    drain(config)
    deliverer = Deliverer(config, config.sink("mirror"), spark)
    run = Background(lambda: deliverer.run(until_idle=False), deliverer.stop)
    try:
        start = _offset(config)
        wait_until(lambda: _offset(config) != start, 60, "the first batches")
        _restart(cluster)  # the state database and the mirror together, mid-backlog
        time.sleep(1)
        assert run.is_alive(), run.error
        for v in range(3, 5):
            _write(source_db, 2000, 4000, v)
        drain(config)
        wait_until(lambda: _caught_up(config), 120, "delivery after the restart")

        # The mirror alone ends the delivery's session.
        _write(source_db, 1, 500, 9)
        drain(config)
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE datname = %s AND pid <> pg_backend_pid()", (dest.name,)).fetchone()
        assert ended and ended[0] >= 1
        _write(source_db, 4000, 4500, 10)
        drain(config)
        wait_until(lambda: _caught_up(config), 120, "delivery after the mirror's session ended")
        assert run.is_alive(), run.error
        stats: DeliveryStats = run.finish()
    finally:
        deliverer.stop()
    print(stats)
    assert stats.outage_retries >= 2 and stats.parked == 0 and stats.discarded == 0
    assert assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct") > 3000
