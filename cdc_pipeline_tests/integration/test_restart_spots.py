"""A drain killed at the exact spots where CDC tools have lost changes on restart (issue 33 item 2), on every
PostgreSQL version: right after logging a commit whose end LSN is the next transaction's first change LSN
(PostgreSQL 17+, Debezium dbz#76), at a transactional logical message with DML after it in the same
transaction (dbz#2058), mid-way through a large transaction, and right after a heartbeat. After each, a new
drain on the same slot and state logs every change exactly once.

The kill is a fault injected into the real drain at that point (an exception from its commit step or from a
message hook): a SIGKILL cannot be aimed at one WAL position. What the dead drain left (its state
transaction open or committed, the slot acknowledged or not) is what a SIGKILL leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.drain import Drain, DrainStats
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import pgoutput
from cdc_pipeline_tests.conftest import Database

pytestmark = pytest.mark.pg_matrix

KILL_PREFIX = "test.kill"


class Killed(Exception):
    """The injected crash (neither transient nor permanent to the drain: it ends the run)."""


class KilledAfterCommit(Drain):
    """Dies right after a commit of the log (and the slot's acknowledgement) that `when` picks."""

    def __init__(self, config: PipelineConfig, when: Callable[[DrainStats, int], bool]) -> None:
        super().__init__(config)
        self.when = when

    def _commit(self, state: Any, stream: Any, stats: DrainStats, end_lsn: int, ts: Any) -> int:
        done = super()._commit(state, stream, stats, end_lsn, ts)
        if self.when(stats, end_lsn):
            raise Killed(f"killed after committing up to {end_lsn}")
        return done


def _die(*_: Any) -> tuple[int, int]:
    raise Killed("killed at the message")


def _config(db: Database, write_config: Callable[..., PipelineConfig]) -> PipelineConfig:
    db.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    config = write_config({
        "source": {"dsn": db.dsn, "slot": "cdc_test", "publication": "cdc_test"},
        # Every transaction its own log commit: the kill lands right after the one it aims at.
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 50, "batch_rows": 1},
        "tables": [{"name": "public.t"}],
    })
    setup(config)
    return config


def _killed(drain: Drain) -> None:
    with pytest.raises(Killed):
        drain.run(until_idle=True, seconds=120)


def _logged(config: PipelineConfig) -> dict[str, int]:
    """How often each key is in the log (a change logged twice or never shows)."""
    with psycopg.connect(config.state_dsn) as conn:
        rows = conn.execute("SELECT pk, count(*) FROM cdc_pipeline.change_log GROUP BY pk").fetchall()
    return {str(pk): int(n) for pk, n in rows}


def _once(ids: range | list[int]) -> dict[str, int]:
    return {f"[{i}]": 1 for i in ids}


def _transactions(db: Database, slot: str) -> list[tuple[int, int]]:
    """(first change LSN, commit end LSN) of each transaction with changes on a spare pgoutput slot, as the
    server reports them (a peek: the slot stays where it is)."""
    rows = db.execute(
        "SELECT lsn - '0/0', data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', 'cdc_test')", (slot,))
    out: list[tuple[int, int]] = []
    first: int | None = None
    for lsn, data in rows:
        msg = pgoutput.decode(memoryview(data))
        if isinstance(msg, (pgoutput.Insert, pgoutput.Update, pgoutput.Delete)) and first is None:
            first = int(lsn)
        elif isinstance(msg, pgoutput.Commit):
            if first is not None:
                out.append((first, msg.end_lsn))
            first = None
    return out


def test_commit_end_lsn_equal_to_the_next_first_change(source_db: Database,
                                                        write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(source_db, write_config)
    source_db.execute("SELECT pg_create_logical_replication_slot('spot_probe', 'pgoutput')")
    # Commits flushed before they return (the test cluster runs synchronous_commit=off): decoding reads only
    # flushed WAL, and the peeks below must see T1 and then T2.
    with source_db.connect(options="-c synchronous_commit=on") as c1, \
            psycopg.connect(source_db.dsn, options="-c synchronous_commit=on") as c2:
        c2.execute("SELECT 1")  # T2 open, no xid yet
        c1.execute("INSERT INTO t VALUES (1, 'T1')")  # T1 commits
        c2.execute("INSERT INTO t VALUES (2, 'T2 first')")  # T2's first change, right after T1's commit record
        [(_, t1_end)] = _transactions(source_db, "spot_probe")
        # Dies right after logging T1 and acknowledging its end LSN to the slot, T2 still open.
        _killed(KilledAfterCommit(config, lambda _stats, end: end >= t1_end))
        c2.execute("INSERT INTO t VALUES (3, 'T2 second')")
        c2.commit()
        major = c1.info.server_version // 10000
    [_, (t2_first, _)] = _transactions(source_db, "spot_probe")
    print(f"PostgreSQL {major}: T1 ends at {t1_end}, T2's first change at {t2_first}")
    if major >= 17:
        assert t2_first == t1_end, "the spot was not reached: T2's first change is not at T1's commit end LSN"
    source_db.execute("SELECT pg_drop_replication_slot('spot_probe')")
    Drain(config).run(until_idle=True, seconds=120)
    assert _logged(config) == _once([1, 2, 3])


def test_dml_after_a_transactional_message(source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(source_db, write_config)
    with source_db.connect() as conn:
        conn.execute("INSERT INTO t VALUES (1, 'before')")
        with conn.transaction():
            conn.execute("INSERT INTO t VALUES (2, 'in, before the message')")
            conn.execute("SELECT pg_logical_emit_message(true, %s, 'x')", (KILL_PREFIX,))
            conn.execute("INSERT INTO t VALUES (3, 'in, after the message')")
            conn.execute("UPDATE t SET v = 'updated after the message' WHERE id = 2")
        conn.execute("INSERT INTO t VALUES (4, 'after')")
    _killed(Drain(config, message_hooks={KILL_PREFIX: _die}))
    assert _logged(config) == _once([1])  # the killed transaction left nothing
    Drain(config).run(until_idle=True, seconds=120)
    assert _logged(config) == {**_once([1, 3, 4]), "[2]": 2}  # 2: its insert and its update


def test_mid_large_transaction(source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(source_db, write_config)
    half = 12_000  # more than two of the drain's 5,000-row COPY chunks before the kill
    with source_db.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO t SELECT g, 'first half' FROM generate_series(1, %s::int) g", (half,))
        conn.execute("SELECT pg_logical_emit_message(true, %s, 'x')", (KILL_PREFIX,))
        conn.execute("INSERT INTO t SELECT g, 'second half' FROM generate_series(%s::int, %s::int) g", (half + 1, 2 * half))
    _killed(Drain(config, message_hooks={KILL_PREFIX: _die}))
    assert _logged(config) == {}
    Drain(config).run(until_idle=True, seconds=120)
    assert _logged(config) == _once(range(1, 2 * half + 1))


def test_right_after_a_heartbeat(source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(source_db, write_config)
    with psycopg.connect(source_db.dsn) as open_txn:
        open_txn.execute("INSERT INTO t VALUES (1, 'open across the heartbeat')")  # before the heartbeat
        _killed(KilledAfterCommit(config, lambda stats, _end: stats.heartbeats >= 1))
        source_db.execute("INSERT INTO t VALUES (2, 'committed while no drain ran')")
        open_txn.execute("INSERT INTO t VALUES (3, 'open, after the heartbeat')")
        open_txn.commit()
    with psycopg.connect(config.state_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.change_log").fetchone() == (0,)
    Drain(config).run(until_idle=True, seconds=120)
    assert _logged(config) == _once([1, 2, 3])
