"""The self-healing drain under real faults, on a throwaway cluster with wal_sender_timeout = 2 s.

Each test keeps ONE drain running through the faults (a `cdc-pipeline drain` subprocess, or an
in-process Drain where a fault hook is needed) and checks at the end that the change log holds exactly
the source's committed transactions: none lost, none twice, every key's versions in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.capture.reconcile import Reconciler
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import embedded
from cdc_pipeline_tests import pg_versions
from cdc_pipeline_tests.conftest import Database, _drop
from cdc_pipeline_tests.helpers import assert_mirrored, deliver
from cdc_pipeline_tests.integration.ops.test_crash_recovery import (
    CLI,
    DDL,
    TABLES,
    join_writers,
    run_writers,
)

WAL_SENDER_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[int | None, embedded.EmbeddedPostgres]]:
    """The module's cluster of each major version, started on first use."""
    made: dict[int | None, embedded.EmbeddedPostgres] = {}
    try:
        yield made
    finally:
        for pg in made.values():
            pg.destroy()


@pytest.fixture
def cluster(pg_major: int | None, clusters: dict[int | None, embedded.EmbeddedPostgres]
            ) -> embedded.EmbeddedPostgres:
    # Function scope on purpose: a module-scoped fixture built on the parametrized pg_major outlives its
    # parameter, and pytest hands it to the module's unmarked tests (they ran on the last matrix version).
    if pg_versions.bin_dir(pg_major) is None:
        pg_major = None  # the machine's own version: the unmarked tests' cluster
    if pg_major not in clusters:
        for other in list(clusters):  # tests run grouped by version: one cluster at a time
            clusters.pop(other).destroy()
        pg = embedded.create(bin_dir=pg_versions.bin_dir(pg_major))
        pg.start(durable=False)
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET wal_sender_timeout = '{WAL_SENDER_TIMEOUT_S}s'")
            conn.execute("SELECT pg_reload_conf()")
        clusters[pg_major] = pg
    return clusters[pg_major]


@pytest.fixture
def fdb(cluster: embedded.EmbeddedPostgres) -> Iterator[Database]:
    name = f"f_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name)
    yield Database(cluster.dsn(), name)
    _drop(cluster.dsn(), name)


def _config(db: Database, write_config: Callable[..., PipelineConfig], **drain: Any) -> PipelineConfig:
    db.execute(DDL)
    data = {
        "source": {"dsn": db.dsn, "slot": "cdc_test", "publication": "cdc_test"},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100, "retry_initial_ms": 100, "retry_max_ms": 1000,
                  "status_interval_seconds": 1, **drain},
        "backfill": {"initial_page_size": 500, "max_page_size": 500},
        "tables": [{"name": t} for t in TABLES],
        "sinks": [{"name": "mirror", "tables": TABLES,
                   "destination": {"type": "postgres", "dsn": db.dsn, "table": "mirror.{table}", "mode": "mirror"}}],
    }
    config = write_config(data)
    setup(config)
    return config


def _spawn_drain(config: PipelineConfig, tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    assert config.path
    err = tmp / f"drain-{uuid.uuid4().hex[:6]}.err"
    with open(err, "wb") as e:
        proc = subprocess.Popen([CLI, "--config", config.path, "drain", *args], stdout=subprocess.PIPE, stderr=e,
                                start_new_session=True)
    return proc, err


@contextlib.contextmanager
def _running_drain(config: PipelineConfig, tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A drain process that is killed on the way out if the test did not stop it."""
    proc, err = _spawn_drain(config, tmp)
    try:
        yield proc, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _failed_with(proc: subprocess.Popen[bytes], err: Path, timeout: float = 30) -> str:
    """The drain's stderr once it exited with 1 (a permanent error)."""
    proc.wait(timeout)
    message = err.read_text()
    print(message)
    assert proc.returncode == 1, message
    return message


def _active_pid(db: Database) -> int | None:
    rows = db.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'cdc_test'")
    return rows[0][0] if rows and rows[0][0] else None


def _wait_active(db: Database, proc: subprocess.Popen[bytes] | None, not_pid: int | None = None,
                 timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid = _active_pid(db)
        except psycopg.OperationalError:  # the server is restarting
            pid = None
        if pid and pid != not_pid:
            return pid
        assert proc is None or proc.poll() is None, "the drain exited"
        assert time.monotonic() < deadline, "the drain did not attach to the slot"
        time.sleep(0.05)


def _changes_by_xid(config: PipelineConfig) -> dict[int, int]:
    with psycopg.connect(config.state_dsn) as conn:
        return dict(conn.execute("SELECT xid, count(*) FROM cdc_pipeline.change_log WHERE xid IS NOT NULL "
                                 "GROUP BY xid").fetchall())


def _wait_log_complete(config: PipelineConfig, txns: dict[int, int], timeout: float = 60) -> None:
    """The log's changes (backfill reads aside) are exactly the committed transactions, each once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_changes_by_xid(config).get(x) != n for x, n in txns.items()):
        time.sleep(0.2)
    logged = _changes_by_xid(config)
    missing = {x: (n, logged.get(x)) for x, n in txns.items() if logged.get(x) != n}
    assert not missing, f"{len(missing)} transactions missing or incomplete: {list(missing.items())[:5]}"
    assert not set(logged) - set(txns), f"unknown transactions in the log: {sorted(set(logged) - set(txns))[:5]}"


def _assert_key_order(config: PipelineConfig) -> None:
    """Every key's `ver` never goes down in log order (each writer raises ver with every write)."""
    with psycopg.connect(config.state_dsn) as conn:
        bad = conn.execute(
            "SELECT table_name, pk, v, pv FROM (SELECT table_name, pk, (record->>'ver')::bigint v, "
            "lag((record->>'ver')::bigint) OVER (PARTITION BY table_name, pk ORDER BY commit_lsn, commit_idx) pv "
            "FROM cdc_pipeline.change_log WHERE action IN ('insert', 'update')) x WHERE v < pv LIMIT 5").fetchall()
    assert not bad, f"versions out of order in the log: {bad}"


def _sessions(out: str) -> int:
    found = re.search(r"; (\d+) replication sessions", out)
    assert found, out
    return int(found.group(1))


def _stop(proc: subprocess.Popen[bytes], err: Path) -> tuple[str, str]:
    assert proc.poll() is None, f"the drain exited (rc {proc.returncode}): {err.read_text()}"
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.read_text()
    return out.decode(), err.read_text()


# --------------------------------------------------------------------------------------------------


@pytest.mark.pg_matrix
def test_walsender_terminated_repeatedly(fdb: Database, write_config: Callable[..., PipelineConfig],
                                         tmp_path: Path) -> None:
    config = _config(fdb, write_config)
    with _running_drain(config, tmp_path) as (proc, err):
        pid = _wait_active(fdb, proc)
        writers = run_writers(fdb.dsn, 16_000, rate=3_000, seed=11)
        kills = 0
        while kills < 4 or any(w.is_alive() for w in writers):
            time.sleep(0.7)
            fdb.execute("SELECT pg_terminate_backend(%s)", (pid,))
            kills += 1
            pid = _wait_active(fdb, proc, not_pid=pid)
        txns = join_writers(writers)
        _wait_log_complete(config, txns)
        _assert_key_order(config)
        out, log = _stop(proc, err)
    print(f"{kills} walsenders terminated; {out.strip()}")
    assert log.count("drain: lost while") >= kills, log
    assert _sessions(out) >= kills, out


def _restart(cluster: embedded.EmbeddedPostgres) -> None:
    cluster._run(cluster.bin("pg_ctl"), "-D", str(cluster.data_dir), "-l", str(cluster.root / "postgres.log"),
                 "-o", f"-p {cluster.port}", "-m", "fast", "-w", "-t", "60", "restart")


@pytest.mark.pg_matrix
def test_source_restart_mid_stream(fdb: Database, cluster: embedded.EmbeddedPostgres,
                                   write_config: Callable[..., PipelineConfig], tmp_path: Path) -> None:
    config = _config(fdb, write_config)  # the state lives in the source database: both restart
    with _running_drain(config, tmp_path) as (proc, err):
        _wait_active(fdb, proc)
        txns = join_writers(run_writers(fdb.dsn, 20_000, rate=None, seed=21))
        behind = sum(txns.values()) - sum(_changes_by_xid(config).values())
        _restart(cluster)
        print(f"restarted the source with the log {behind} changes behind")
        _wait_active(fdb, proc, timeout=30)
        txns.update(join_writers(run_writers(fdb.dsn, 6_000, rate=3_000, seed=22, base=10_000_000)))
        _wait_log_complete(config, txns)
        _assert_key_order(config)
        out, log = _stop(proc, err)
    print(out.strip())
    assert "drain: lost while" in log and "retry" in log, log


def test_reconciliation_longer_than_wal_sender_timeout(fdb: Database, write_config: Callable[..., PipelineConfig],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages whose reconciliation outlasts wal_sender_timeout, writers, and a SIGKILLed backfill process:
    one replication session throughout, and the log ends equal to the source."""
    config = _config(fdb, write_config)
    with fdb.connect() as conn:
        seed = conn.execute("INSERT INTO acct SELECT g, 1, 0, 'seed' FROM generate_series(1, 1500) g "
                            "RETURNING pg_current_xact_id()::text::bigint & 4294967295").fetchone()
    assert seed
    slow_pages = []
    original = Reconciler._reconcile

    def slow(self: Reconciler, *args: Any) -> tuple[int, int]:  # fault hook: pages that take 1.5x wal_sender_timeout
        if len(slow_pages) < 3:
            time.sleep(WAL_SENDER_TIMEOUT_S * 1.5)
        slow_pages.append(1)
        return original(self, *args)

    monkeypatch.setattr(Reconciler, "_reconcile", slow)
    drain = Drain(config)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("stats", drain.run()), daemon=True)
    thread.start()
    assert config.path
    backfill = [CLI, "--config", config.path, "backfill", "public.acct", "--quiet"]
    try:
        writers = run_writers(fdb.dsn, 3_000, rate=500, seed=31, base=20_000_000)
        first = subprocess.Popen(backfill, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 30
        while len(slow_pages) < 2:  # killed after its first slow page, with the second one being reconciled
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no page was reconciled"
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        done = subprocess.run(backfill, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        txns = join_writers(writers)
        txns[int(seed[0])] = 1500
        _wait_log_complete(config, txns)
    finally:
        drain.stop()
        thread.join(60)
    stats = result["stats"]
    print(f"{len(slow_pages)} pages, 3 slow; {stats}; {done.stdout.strip()}")
    # The status keeper kept the one replication session alive through every slow page.
    assert stats.sessions == 1 and stats.retries == 0, stats
    for table, key in (("public.acct", "id"), ("public.evt", "k")):
        logged, source = _log_state(config, table, key), _source_state(fdb, table, key)
        # Name the first differences only: a diff of thousands of rows takes pytest minutes to render.
        wrong = [k for k in source.keys() | logged.keys() if logged.get(k) != source.get(k)]
        assert not wrong, f"{table}: {len(wrong)} rows differ, e.g. {[(k, logged.get(k), source.get(k)) for k in wrong[:3]]}"


def _log_state(config: PipelineConfig, table: str, key: str) -> dict[str, Any]:
    """The table as the log describes it, applied as a mirror would: each key's last insert/update/read,
    minus deletes, truncates and the old key of an update that changed the key."""
    schema, name = table.split(".")
    rows: dict[str, Any] = {}
    with psycopg.connect(config.state_dsn) as conn:
        for action, pk, record, changes in conn.execute(
                # A typed read (bound for a Postgres mirror) holds its row as `tup`: its JSON as consumers get it.
                "SELECT action, pk, coalesce(record, cdc_pipeline.typed_record(backfill_id, tup)), changes "
                "FROM cdc_pipeline.change_log WHERE table_schema = %s "
                "AND table_name = %s ORDER BY commit_lsn, commit_idx", (schema, name)):
            if action == "truncate":
                rows.clear()
            elif action == "delete":
                rows.pop(pk, None)
            else:
                if changes and key in changes:
                    rows.pop(json.dumps([changes[key]]), None)
                rows[pk] = record
    return rows


def _source_state(db: Database, table: str, key: str) -> dict[str, Any]:
    schema, name = table.split(".")
    query = sql.SQL("SELECT jsonb_build_array({})::text, to_jsonb(t) FROM {} t").format(
        sql.Identifier(key), sql.Identifier(schema, name))
    with db.connect() as conn:
        return dict(conn.execute(query).fetchall())


def test_state_restored_from_older_dump(fdb: Database, cluster: embedded.EmbeddedPostgres,
                                        write_config: Callable[..., PipelineConfig],
                                        tmp_path: Path, spark: Any) -> None:
    config = _config(fdb, write_config)
    fdb.execute("INSERT INTO acct SELECT g, 1, 0, 'a' FROM generate_series(1, 300) g;"
                "INSERT INTO evt SELECT 'k' || g, 1, 0, NULL FROM generate_series(1, 100) g")
    Drain(config).run(until_idle=True, seconds=60)
    deliver(config, spark)  # the mirror holds the rows the gap will delete
    dump = tmp_path / "state.dump"
    # The cluster's own pg_dump/pg_restore: the module's cluster may be of another major version (pg_matrix).
    pg = [str(cluster.bin_dir / "pg_dump"), "-Fc", "-n", "cdc_pipeline", "-f", str(dump), fdb.dsn]
    subprocess.run(pg, check=True)
    # Changes the restored state will not know of: updates, inserts, deletes in both tables.
    fdb.execute("UPDATE acct SET ver = 2, note = 'gap' WHERE id <= 50; DELETE FROM acct WHERE id > 280;"
                "INSERT INTO acct VALUES (1001, 1, 0, 'gap'); DELETE FROM evt WHERE k = 'k7';"
                "UPDATE evt SET n = 5, ver = 2 WHERE k = 'k9'")
    Drain(config).run(until_idle=True, seconds=60)
    fdb.execute("DROP SCHEMA cdc_pipeline CASCADE")
    subprocess.run([str(cluster.bin_dir / "pg_restore"), "-d", fdb.dsn, str(dump)], check=True)
    fdb.execute("INSERT INTO acct VALUES (2001, 1, 0, 'after')")  # must not be streamed past the gap
    before = fdb.execute("SELECT count(*), (SELECT committed_lsn FROM cdc_pipeline.slot_progress) "
                         "FROM cdc_pipeline.change_log")[0]

    message = _failed_with(*_spawn_drain(config, tmp_path, "--until-idle", "--seconds", "30"), timeout=60)
    assert "gap in the change log" in message and "public.acct, public.evt" in message
    assert "between LSN" in message and "drain.on_gap: backfill" in message
    assert fdb.execute("SELECT count(*), (SELECT committed_lsn FROM cdc_pipeline.slot_progress) "
                       "FROM cdc_pipeline.change_log")[0] == before, "the drain streamed past the gap"

    assert config.path
    data = yaml.safe_load(Path(config.path).read_text())
    data["drain"]["on_gap"] = "backfill"
    config = write_config(data)
    stats = Drain(config).run(until_idle=True, seconds=120)
    assert stats.gaps, stats
    assert fdb.execute("SELECT count(*) FROM cdc_pipeline.backfills WHERE status = 'completed' "
                       "AND origin LIKE 'drain gap %'")[0][0] == 2
    for table, key in (("public.acct", "id"), ("public.evt", "k")):
        logged, source = _log_state(config, table, key), _source_state(fdb, table, key)
        # Name the first differences only: a diff of thousands of rows takes pytest minutes to render.
        wrong = [k for k in source.keys() | logged.keys() if logged.get(k) != source.get(k)]
        assert not wrong, f"{table}: {len(wrong)} rows differ, e.g. {[(k, logged.get(k), source.get(k)) for k in wrong[:3]]}"
    stats = deliver(config, spark)
    assert stats.parked == 0
    assert_mirrored(fdb.dsn, "public.acct", fdb.dsn, "mirror.acct")
    assert_mirrored(fdb.dsn, "public.evt", fdb.dsn, "mirror.evt")
    again = Drain(config).run(until_idle=True, seconds=60)  # the gap is closed: the next run just streams
    assert not again.gaps and again.retries == 0


@pytest.mark.pg_matrix
def test_slot_dropped_is_permanent(fdb: Database, write_config: Callable[..., PipelineConfig],
                                   tmp_path: Path) -> None:
    config = _config(fdb, write_config)
    with _running_drain(config, tmp_path) as (proc, err):
        pid = _wait_active(fdb, proc)
        deadline = time.monotonic() + 20
        while True:  # the drain reconnects within 100 ms: terminate and drop until the drop wins
            fdb.execute("SELECT pg_terminate_backend(%s)", (pid,))
            try:
                fdb.execute("SELECT pg_drop_replication_slot('cdc_test')")
                break
            except psycopg.errors.ObjectInUse:
                pid = _active_pid(fdb) or pid
                assert time.monotonic() < deadline
        message = _failed_with(proc, err)  # inside: a drain still running is killed on the way out
    assert "replication slot 'cdc_test' does not exist" in message and "cdc-pipeline setup" in message


def test_state_database_restart(source_db: Database, cluster: embedded.EmbeddedPostgres,
                                write_config: Callable[..., PipelineConfig], tmp_path: Path) -> None:
    """The state database alone restarts (the source is the shared cluster): the same drain rides through."""
    state_name = f"s_{uuid.uuid4().hex[:12]}"
    cluster.create_database(state_name)
    state = Database(cluster.dsn(), state_name)
    source_db.execute(DDL)
    data = {
        "source": {"dsn": source_db.dsn, "slot": "cdc_test", "publication": "cdc_test"},
        "state": {"dsn": state.dsn},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100, "retry_initial_ms": 100, "retry_max_ms": 1000},
        "tables": [{"name": t} for t in TABLES],
    }
    config = write_config(data)
    setup(config)
    try:
        with _running_drain(config, tmp_path) as (proc, err):
            _wait_active(source_db, proc)
            writers = run_writers(source_db.dsn, 12_000, rate=3_000, seed=41)
            time.sleep(1.5)
            _restart(cluster)
            txns = join_writers(writers)
            _wait_log_complete(config, txns)
            _assert_key_order(config)
            out, log = _stop(proc, err)
    finally:
        _drop(cluster.dsn(), state_name)
    print(out.strip())
    assert "drain: lost while" in log and _sessions(out) >= 2, (out, log)


def test_login_refused_is_permanent(fdb: Database, write_config: Callable[..., PipelineConfig],
                                    tmp_path: Path) -> None:
    config = _config(fdb, write_config)
    fdb.execute("DO $$ BEGIN CREATE ROLE cdc_nologin NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    assert config.path
    data = yaml.safe_load(Path(config.path).read_text())
    data["source"]["dsn"] = fdb.dsn.replace("user=postgres", "user=cdc_nologin password=s3cret")
    config = write_config(data, name="nologin.yaml")
    message = _failed_with(*_spawn_drain(config, tmp_path))
    assert "not permitted to log in" in message and "fix the credentials" in message
    assert "s3cret" not in message


# 18 decodes on without the publication (pgoutput warns and sends nothing): the drain must end all the same,
# before acknowledging anything past the drop.
@pytest.mark.parametrize("pg_major", [15, 18], ids=lambda m: f"pg{m}", scope="module")
def test_publication_dropped_is_permanent(fdb: Database, write_config: Callable[..., PipelineConfig],
                                          tmp_path: Path) -> None:
    config = _config(fdb, write_config)
    with _running_drain(config, tmp_path) as (proc, err):
        _wait_active(fdb, proc)
        fdb.execute("DROP PUBLICATION cdc_test")
        fdb.execute("INSERT INTO acct VALUES (1, 1, 1, 'after the drop')")
        (after_insert,) = fdb.execute("SELECT pg_current_wal_insert_lsn() - '0/0'")[0]
        message = _failed_with(proc, err)
    assert "publication 'cdc_test' does not exist" in message and "cdc-pipeline setup" in message
    # Nothing past the drop's first change was acknowledged: the slot still holds the insert.
    (confirmed,) = fdb.execute("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots "
                               "WHERE slot_name = 'cdc_test'")[0]
    assert confirmed < after_insert


@pytest.mark.pg_matrix
def test_slot_invalidated_is_permanent(fdb: Database, cluster: embedded.EmbeddedPostgres,
                                       write_config: Callable[..., PipelineConfig], tmp_path: Path) -> None:
    config = _config(fdb, write_config)
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            # No drain: the slot falls behind by far more than it may keep, and a checkpoint removes the WAL.
            for _ in range(3):
                fdb.execute("INSERT INTO evt SELECT 'x' || g || random(), 1, 0, ARRAY[repeat(md5(g::text), 20)] "
                            "FROM generate_series(1, 20000) g; SELECT pg_switch_wal()")
            fdb.execute("CHECKPOINT")
            assert fdb.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'cdc_test'") == \
                [("lost",)]
        finally:
            admin.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            admin.execute("SELECT pg_reload_conf()")
    message = _failed_with(*_spawn_drain(config, tmp_path, "--until-idle"))
    assert "was invalidated (wal_status = 'lost'" in message and "pg_drop_replication_slot" in message


def test_network_outage(fdb: Database, cluster: embedded.EmbeddedPostgres,
                        write_config: Callable[..., PipelineConfig], tmp_path: Path) -> None:
    """The drain reaches the source and state through a TCP proxy that goes down for 3 s (every connection
    cut, new ones refused) while writers keep writing directly."""
    from cdc_pipeline_tests.netfaults import TcpProxy

    config = _config(fdb, write_config)
    proxy = TcpProxy(cluster.port).start()
    assert config.path
    data = yaml.safe_load(Path(config.path).read_text())
    data["source"]["dsn"] = f"host=127.0.0.1 port={proxy.port} user=postgres dbname={fdb.name}"
    config = write_config(data, name="proxied.yaml")
    try:
        with _running_drain(config, tmp_path) as (proc, err):
            _wait_active(fdb, proc)
            writers = run_writers(fdb.dsn, 12_000, rate=2_000, seed=51)
            time.sleep(1)
            proxy.stop()
            time.sleep(3)
            assert proc.poll() is None, err.read_text()
            proxy.start()
            txns = join_writers(writers)
            _wait_log_complete(config, txns)
            _assert_key_order(config)
            out, log = _stop(proc, err)
    finally:
        proxy.stop()
    print(out.strip())
    assert "waiting for" in log and _sessions(out) >= 2, (out, log)
    assert "Connection refused" in log or "connection" in log.lower()


def test_lock_still_held_after_a_reconnect_is_waited_for(fdb: Database, write_config: Callable[..., PipelineConfig],
                                                         tmp_path: Path) -> None:
    """The drain's state session dies while its lock is still held elsewhere (as by its own half-dead old
    session after a partition): the drain waits for the lock instead of exiting."""
    from cdc_pipeline.postgres import session

    config = _config(fdb, write_config)
    with _running_drain(config, tmp_path) as (proc, err):
        _wait_active(fdb, proc)
        with fdb.connect() as holder:
            state_pid = fdb.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'cdc_pipeline.drain' "
                                    "AND backend_type = 'client backend' AND datname = current_database() "
                                    "AND pid <> pg_backend_pid() AND query NOT LIKE '%%emit_message%%' "
                                    "ORDER BY backend_start LIMIT 1")[0][0]
            fdb.execute("SELECT pg_terminate_backend(%s)", (state_pid,))
            deadline = time.monotonic() + 10
            while not session.try_lock(holder, "cdc_pipeline.drain:cdc_test"):
                assert time.monotonic() < deadline
            fdb.execute("INSERT INTO acct VALUES (1, 1, 1, 'while the lock is held')")
            time.sleep(2.5)
            assert proc.poll() is None, err.read_text()
        # The holder's session closed: the drain takes the lock and goes on.
        deadline = time.monotonic() + 20
        while fdb.execute("SELECT count(*) FROM cdc_pipeline.change_log")[0][0] < 1:
            assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
            time.sleep(0.1)
        out, log = _stop(proc, err)
    print(log)
    assert "the drain lock for slot 'cdc_test' is still held" in log
    assert "end this drain's previous session" in log
