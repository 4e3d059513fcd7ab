"""The drain's sessions and stream edge cases (issue 9 items 6, 8, 9, 10, 11; a Relation inside a skipped
transaction), against the shared real server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import pgoutput, session
from cdc_pipeline.postgres.replication import ReplicationStream
from cdc_pipeline_tests.conftest import Database


def _config(db: Database, write_config: Callable[..., PipelineConfig], slot: str = "cdc_test",
            publication: str = "cdc_test", state_dsn: str | None = None, name: str = "cdc.yaml",
            **drain: Any) -> PipelineConfig:
    data: dict[str, Any] = {
        "source": {"dsn": db.dsn, "slot": slot, "publication": publication},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100, **drain},
        "tables": [{"name": "public.acct"}],
    }
    if state_dsn:
        data["state"] = {"dsn": state_dsn}
    config = write_config(data, name=name)
    setup(config)
    return config


def _log_count(config: PipelineConfig) -> int:
    with psycopg.connect(config.state_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM cdc_pipeline.change_log").fetchone()
        return int(row[0]) if row else 0


@pytest.fixture
def acct(source_db: Database) -> Database:
    source_db.execute("CREATE TABLE acct (id integer PRIMARY KEY, v integer, doc text)")
    return source_db


def test_publication_named_with_capitals(acct: Database, write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(acct, write_config, publication="AccPub")
    assert acct.execute("SELECT pubname FROM pg_publication") == [("AccPub",)]
    acct.execute("INSERT INTO acct SELECT g, g FROM generate_series(1, 10) g")
    stats = Drain(config).run(until_idle=True, seconds=60)
    assert stats.changes == 10 and _log_count(config) == 10


def test_state_session_merges_options_and_forces_durability(acct: Database, db_factory: Callable[[], Database],
                                                            write_config: Callable[..., PipelineConfig]) -> None:
    state = db_factory()
    # A user's DSN with its own options, two of them unsafe for the log writer.
    user_options = r"-c work_mem=7MB -c synchronous_commit=off -c default_transaction_isolation=repeatable\ read"
    state_dsn = conninfo.make_conninfo(state.dsn, options=user_options)
    config = _config(acct, write_config, state_dsn=state_dsn)
    seen: list[tuple[Any, ...]] = []

    def show(msg: pgoutput.LogicalMessage, lsn: int, idx: int, conn: psycopg.Connection) -> tuple[int, int]:
        # Runs inside the drain's own state transaction.
        row = conn.execute("SELECT current_setting('work_mem'), current_setting('synchronous_commit'), "
                           "current_setting('transaction_isolation'), current_setting('TimeZone'), "
                           "current_setting('statement_timeout'), current_setting('lock_timeout')").fetchone()
        assert row
        seen.append(tuple(row))
        return 0, 0

    acct.execute("SELECT pg_logical_emit_message(true, 'test.show', '')")
    Drain(config, message_hooks={"test.show": show}).run(until_idle=True, seconds=60)
    assert seen == [("7MB", "on", "read committed", "UTC", "15min", "1min")]


def test_sessions_have_keepalives_and_timeouts(pg_admin_dsn: str) -> None:
    params = conninfo.conninfo_to_dict(pg_admin_dsn)
    port = params.get("port", "5432")
    tcp = conninfo.make_conninfo(pg_admin_dsn, host="127.0.0.1", port=port)  # keepalives apply to TCP only
    with session.connect(tcp, statement_timeout_ms=30_000, autocommit=True) as conn:
        got = conn.execute("SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'), "
                           "current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout'), "
                           "current_setting('statement_timeout')").fetchone()
    info = conninfo.conninfo_to_dict(session.conninfo(tcp))
    assert got == ("10", "5", "3", "30000", "30s")
    assert info["connect_timeout"] == "10" and info["keepalives"] == "1" and info["tcp_user_timeout"] == "30000"


def test_lock_keys_are_64_bit(acct: Database, write_config: Callable[..., PipelineConfig]) -> None:
    """Two slots whose drain lock names collide under 32-bit hashtext: both drains run at once."""
    row = acct.execute(
        "SELECT array_agg(s ORDER BY s) FROM (SELECT 's' || g AS s FROM generate_series(1, 400000) g) x "
        "GROUP BY hashtext('cdc_pipeline.drain:' || s) HAVING count(*) > 1 LIMIT 1")
    assert row, "no hashtext collision found"
    one, two = row[0][0][:2]
    first = _config(acct, write_config, slot=one, publication="p1", name="one.yaml")
    second = _config(acct, write_config, slot=two, publication="p2", name="two.yaml")
    with acct.connect() as a, acct.connect() as b:
        assert session.try_lock(a, f"cdc_pipeline.drain:{one}")
        assert session.try_lock(b, f"cdc_pipeline.drain:{two}")
    drains = [Drain(first), Drain(second)]
    errors: list[BaseException] = []

    def run(d: Drain) -> None:
        try:
            d.run(seconds=3)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(d,)) for d in drains]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_buffer_bounded_by_bytes(acct: Database, write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(acct, write_config, batch_bytes=1024 * 1024)
    # One transaction of 40 documents of ~200 KB: 8 MB, far below the 5,000-row chunk.
    acct.execute("INSERT INTO acct SELECT g, g, repeat(md5(g::text), 6400) FROM generate_series(1, 40) g")
    stats = Drain(config).run(until_idle=True, seconds=60)
    assert stats.changes == 40
    assert stats.extra["copies"] >= 7, stats.extra  # written in ~1 MB chunks, not all at once


def test_time_limit_waits_for_a_long_transaction(acct: Database, write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(acct, write_config)
    acct.execute("INSERT INTO acct SELECT g, g FROM generate_series(1, 300000) g")
    started = time.monotonic()
    stats = Drain(config).run(seconds=0.1)  # far shorter than the server takes to decode the transaction
    print(f"{stats.changes} changes in {time.monotonic() - started:.1f} s")
    assert stats.changes == 300_000 and _log_count(config) == 300_000


def test_relation_inside_a_skipped_transaction(acct: Database, write_config: Callable[..., PipelineConfig],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(acct, write_config)
    acct.execute("INSERT INTO acct VALUES (1, 1)")
    # Fault: the log commits but the acknowledgement never reaches the server (a crash in between).
    with monkeypatch.context() as m:
        m.setattr(ReplicationStream, "send_status", lambda self, *a, **kw: None)
        Drain(config).run(until_idle=True, seconds=60)
    assert _log_count(config) == 1
    # Replayed: the first transaction (which carries the table's Relation message) is skipped; the next
    # one's changes still need that relation.
    acct.execute("INSERT INTO acct VALUES (2, 2)")
    # The server skips what is below the requested start; ask from the slot's own position instead (as a
    # replay from its confirmed position would), so the log's transaction does come again.
    original = ReplicationStream.__init__

    def from_confirmed(self: ReplicationStream, dsn: str, slot: str, publication: str, start_lsn: int = 0) -> None:
        original(self, dsn, slot, publication, 0)

    monkeypatch.setattr(ReplicationStream, "__init__", from_confirmed)
    stats = Drain(config).run(until_idle=True, seconds=60)
    assert stats.skipped_transactions >= 1 and stats.changes == 1
    assert _log_count(config) == 2


def test_backfill_sees_the_running_drain(acct: Database, write_config: Callable[..., PipelineConfig]) -> None:
    """The drain's 64-bit lock is what backfills look for to tell whether a drain is running."""
    from cdc_pipeline.state.backfills import BackfillStore

    config = _config(acct, write_config)
    store = BackfillStore(config.state.schema_name)
    drain = Drain(config)
    thread = threading.Thread(target=drain.run, daemon=True)
    with acct.connect() as conn:
        assert not store.drain_running(conn, "cdc_test")
        thread.start()
        deadline = time.monotonic() + 20
        while not store.drain_running(conn, "cdc_test"):
            assert time.monotonic() < deadline, "the drain's lock is not seen"
            time.sleep(0.05)
        drain.stop()
        thread.join(30)
        assert not thread.is_alive(), "the drain did not stop"
        # The server releases a closed session's locks when its backend exits, a moment after the close.
        deadline = time.monotonic() + 10
        while store.drain_running(conn, "cdc_test"):
            assert time.monotonic() < deadline, "the drain's lock outlived the drain"
            time.sleep(0.05)


def test_pool_connections_carry_the_session_settings(source_db: Database) -> None:
    with session.pool(source_db.dsn, max_size=2, statement_timeout_ms=1234, autocommit=True) as pool, \
            pool.connection() as conn:
        row = conn.execute("SELECT current_setting('TimeZone'), current_setting('statement_timeout')").fetchone()
    assert row == ("UTC", "1234ms")
