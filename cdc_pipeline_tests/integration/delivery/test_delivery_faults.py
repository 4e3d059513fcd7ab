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

from cdc_pipeline.admin import status
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.engine import Deliverer, DeliveryStats
from cdc_pipeline.postgres import embedded
from cdc_pipeline_tests.conftest import Database, _drop
from cdc_pipeline_tests.helpers import assert_mirrored, drain, mirror_config, wait_until
from cdc_pipeline_tests.integration.delivery.test_delivery_outage import Background


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


def _remote_config(source: Database, remote: tuple[Database, Database], write_config: Callable[..., PipelineConfig],
                   batch_size: int, retry_ms: tuple[int, int]) -> PipelineConfig:
    """public.acct mirrored to the remote mirror database, the state in the remote state database; set up."""
    state, dest = remote
    data = mirror_config(source.dsn, dest.dsn, ["public.acct"], target="mirror.acct", batch_size=batch_size)
    data["state"] = {"dsn": state.dsn}
    data["delivery"] = {"idle_seconds": 0.1, "retry_initial_ms": retry_ms[0], "retry_max_ms": retry_ms[1]}
    config = write_config(data)
    setup(config)
    return config


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
    config = _remote_config(source_db, remote, write_config, batch_size=300, retry_ms=(200, 1000))
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


def test_typed_runs_ride_through_the_state_database_ending_their_sessions(
        source_db: Database, remote: tuple[Database, Database], write_config: Callable[..., PipelineConfig],
        spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Runs of typed reads are relayed from the state database's COPY (state/typed_log.py): its sessions
    are ended again and again while runs stream. The same Deliverer rides through (waiting for the state
    database, not blaming the destination), and the mirror ends equal to the source."""
    from cdc_pipeline_tests.integration.backfill.test_backfill import backfill

    state, dest = remote
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance int, note text)")
    source_db.execute("INSERT INTO acct SELECT g, g, repeat(E'x\\t', 40) FROM generate_series(1, 20000) g")
    config = _remote_config(source_db, remote, write_config, batch_size=500, retry_ms=(100, 500))
    backfill(config, "public.acct")
    with psycopg.connect(state.dsn) as conn:
        typed = conn.execute("SELECT count(*) FROM cdc_pipeline.change_log WHERE tup IS NOT NULL").fetchone()
    assert typed == (20000,)  # all of them typed reads: every batch is a relayed run
    deliverer = Deliverer(config, config.sink("mirror"), spark)
    run = Background(lambda: deliverer.run(until_idle=False), deliverer.stop)
    ended = 0
    try:
        start = _offset(config)
        wait_until(lambda: _offset(config) != start, 60, "the first runs")
        with psycopg.connect(state.dsn, autocommit=True) as admin:
            for _ in range(15):
                row = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s "
                                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                                    (state.name,)).fetchone()
                ended += row[0] if row else 0
                time.sleep(0.2)
        wait_until(lambda: _caught_up(config), 120, "delivery after the state database's sessions ended")
        assert run.is_alive(), run.error
        stats: DeliveryStats = run.finish()
    finally:
        deliverer.stop()
    print(stats, ended)
    assert ended >= 10 and stats.outage_retries >= 1 and stats.parked == 0
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("deliver: sink mirror: waiting")]
    assert waits and all("waiting for the state database" in w for w in waits), waits
    assert assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct") == 20000


def test_a_sink_ahead_of_the_state_is_recorded_at_start(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig],
        spark: Any) -> None:
    """The mirror records its position in its own transaction, before the state's offset commit: a crash
    between the two leaves the state behind. The next delivery starts from the mirror's position and
    records it in the state at once, so `status` shows no lag although nothing new arrives."""
    from cdc_pipeline_tests.helpers import deliver

    dest = db_factory()
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance int)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.acct"], target="mirror.acct"))
    setup(config)
    source_db.execute("INSERT INTO acct SELECT g, g FROM generate_series(1, 50) g")
    drain(config)
    assert deliver(config, spark).delivered == 50
    with psycopg.connect(config.state_dsn) as conn:  # the state's offset commit of the last batch was lost
        conn.execute("UPDATE cdc_pipeline.sink_offsets SET commit_lsn = 0, commit_idx = -1, delivered = 0")
    assert status.collect(config)["sinks"]["mirror"]["lag_messages"] == 50
    stats = deliver(config, spark)
    assert stats.delivered == 0  # nothing sent again
    sink = status.collect(config)["sinks"]["mirror"]
    assert sink["lag_messages"] == 0 and sink["delivered"] == 50
    assert assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct") == 50
