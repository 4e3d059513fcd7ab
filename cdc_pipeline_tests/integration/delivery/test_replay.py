"""Replays: `cdc-pipeline replay` re-delivers exactly a window's changes to one sink, in order, with the
same messages; other sinks and offsets stay as they were; a window before the retained log is refused."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg
import redis

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.cli import main as cli_main
from cdc_pipeline.state import retention
from cdc_pipeline_tests.helpers import deliver, drain, mirror_config


def now(db: Any) -> str:
    return db.execute("SELECT clock_timestamp()")[0][0].isoformat()


def offsets(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT sink, commit_lsn, commit_idx, delivered FROM cdc_pipeline.sink_offsets "
                            "ORDER BY sink").fetchall()


def test_replay_window_to_an_append_sink_only(source_db, db_factory, write_config, spark, capsys):
    dest = db_factory()
    key = f"replay-{uuid.uuid4().hex[:8]}"
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE u (id int PRIMARY KEY)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t", "public.u"])
    data["sinks"] = [
        {"name": "stream", "tables": ["public.t", "public.u"],
         "destination": {"type": "redis_stream", "stream_key": key}},
        {"name": "other", "tables": ["public.t", "public.u"],
         "destination": {"type": "postgres", "dsn": dest.dsn, "table": "out.other", "mode": "append"}},
    ]
    config = write_config(data)
    setup(config)
    r = redis.Redis()
    try:
        source_db.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        time.sleep(0.3)
        start = now(source_db)
        source_db.execute("UPDATE t SET v = 'a2' WHERE id = 1")
        source_db.execute("INSERT INTO u VALUES (10)")
        with source_db.connect() as conn, conn.transaction():
            conn.execute("INSERT INTO t VALUES (4, 'd')")
            conn.execute("DELETE FROM t WHERE id = 2")
        end = now(source_db)
        time.sleep(0.3)
        source_db.execute("INSERT INTO t VALUES (5, 'e')")
        drain(config)
        deliver(config, spark, sink="stream")
        deliver(config, spark, sink="other")
        first = r.xrange(key)
        assert len(first) == 8
        before = offsets(config.state_dsn)
        with psycopg.connect(dest.dsn) as conn:
            other_before = conn.execute("SELECT count(*), max(delivered_at) FROM out.other").fetchone()

        assert cli_main(["replay", "--config", str(config.path), "--sink", "stream", "--from", start,
                         "--to", end]) == 0
        assert '"messages_delivered": 4' in capsys.readouterr().out
        replayed = r.xrange(key)[8:]
        # Exactly the window's changes (first[3:7]), in commit order, as the same messages.
        assert [f[b"key"] for _, f in replayed] == [f[b"key"] for _, f in first[3:7]]
        assert [f[b"data"] for _, f in replayed] == [f[b"data"] for _, f in first[3:7]]
        assert offsets(config.state_dsn) == before
        with psycopg.connect(dest.dsn) as conn:
            assert conn.execute("SELECT count(*), max(delivered_at) FROM out.other").fetchone() == other_before

        # --table narrows the window to one table's changes.
        assert cli_main(["replay", "--config", str(config.path), "--sink", "stream", "--from", start,
                         "--to", end, "--table", "u"]) == 0
        [(_, only)] = r.xrange(key)[12:]
        assert only[b"data"] == first[4][1][b"data"] and b'"table_name":"u"' in only[b"data"]

        # Then the sink continues where it was: the next change, nothing else.
        source_db.execute("INSERT INTO t VALUES (6, 'f')")
        drain(config)
        deliver(config, spark, sink="stream")
        [(_, nxt)] = r.xrange(key)[13:]
        message = json.loads(nxt[b"data"])
        assert message["record"]["id"] == 6 and message["action"] == "insert"
    finally:
        r.delete(key)
        r.close()


def test_window_before_the_retained_log_is_refused(source_db, db_factory, write_config, spark, capsys):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    early = now(source_db)
    source_db.execute("INSERT INTO t VALUES (1, 'a')")
    drain(config)
    deliver(config, spark)
    time.sleep(0.2)
    with psycopg.connect(config.state_dsn) as conn:
        assert retention.trim_log(conn, "cdc_pipeline", 0.00001, ["mirror"]) == 1
        conn.commit()
    source_db.execute("INSERT INTO t VALUES (2, 'b')")
    drain(config)
    with psycopg.connect(config.state_dsn) as conn:
        oldest = conn.execute("SELECT min(commit_ts) FROM cdc_pipeline.change_log").fetchone()[0]
    assert cli_main(["replay", "--config", str(config.path), "--sink", "mirror", "--from", early]) == 1
    err = capsys.readouterr().err
    assert "cannot replay from" in err and f"the oldest replayable time is {oldest.isoformat()}" in err
    # A window inside the retained log is accepted.
    assert cli_main(["replay", "--config", str(config.path), "--sink", "mirror", "--from", oldest.isoformat()]) == 0
    assert cli_main(["replay", "--config", str(config.path), "--sink", "mirror", "--from", "yesterday"]) == 2


def mirror_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, v FROM mirror.t ORDER BY id").fetchall()


def test_a_window_that_ends_before_the_offset_leaves_the_mirror_at_its_offset(source_db, db_factory, write_config,
                                                                               spark, capsys):
    """Rows changed after the window are not left at the window's version: a mirror is replayed from the
    window's start up to its offset, so it ends where its offset says."""
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    source_db.execute("INSERT INTO t VALUES (1, 1), (2, 1)")
    time.sleep(0.2)
    t1 = now(source_db)
    source_db.execute("UPDATE t SET v = 2")
    t2 = now(source_db)
    time.sleep(0.2)
    source_db.execute("UPDATE t SET v = 3")
    drain(config)
    deliver(config, spark)
    assert mirror_rows(dest.dsn) == [(1, 3), (2, 3)]
    assert cli_main(["replay", "--config", str(config.path), "--sink", "mirror", "--from", t1, "--to", t2]) == 0
    assert '"messages_delivered": 4' in capsys.readouterr().out  # the window's 2, then the 2 after it
    assert mirror_rows(dest.dsn) == [(1, 3), (2, 3)]


def test_a_replay_beside_live_delivery_never_lands_an_old_version_after_a_new_one(source_db, db_factory, write_config,
                                                                                  spark):
    """The replay is held up in the destination (a row lock) while the source changes a row it replays:
    live delivery waits for the replay (the sink's send lock) instead of writing the new version first,
    so the replay's old version never lands after it. The mirror ends equal to the source."""
    import threading

    from cdc_pipeline.delivery.engine import Deliverer
    from cdc_pipeline.delivery.replay import parse_time, replay
    from cdc_pipeline_tests.integration.backfill.test_backfill import wait_for

    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["delivery"] = {"idle_seconds": 0.1}
    config = write_config(data)
    setup(config)
    start = now(source_db)
    source_db.execute("INSERT INTO t VALUES (1, 1), (2, 1)")
    source_db.execute("UPDATE t SET v = 3")
    drain(config)
    deliver(config, spark)
    live = Deliverer(config, config.sink("mirror"), spark)
    live_thread = threading.Thread(target=live.run, kwargs={"until_idle": False, "seconds": 120})
    replayed: list[Any] = []
    live_thread.start()  # caught up: it waits for changes
    try:
        with psycopg.connect(dest.dsn) as blocker:
            blocker.execute("SELECT * FROM mirror.t WHERE id = 1 FOR UPDATE")  # the replay's writes wait on it
            replay_thread = threading.Thread(target=lambda: replayed.append(
                replay(config, "mirror", parse_time(start), spark=spark)))
            replay_thread.start()
            try:
                wait_for(lambda: bool(dest.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")),
                    what="the replay waiting on the row lock")
                source_db.execute("UPDATE t SET v = 9 WHERE id = 2")
                drain(config)
                # Live delivery waits in the lock queue of exactly the sink's send lock, which the replay holds
                # (one session granted, one waiting), and has written nothing of the new version meanwhile.
                wait_for(lambda: _send_lock_queue(source_db) == [False, True], timeout=60,
                         what="live delivery waiting for the replay's send lock")
                assert mirror_rows(dest.dsn)[1] == (2, 3)
            finally:
                blocker.rollback()
                replay_thread.join(120)
        assert replayed and replayed[0].failed == 0
        wait_for(lambda: mirror_rows(dest.dsn) == [(1, 3), (2, 9)], timeout=60, what="the mirror to equal the source")
        assert mirror_rows(dest.dsn) == [tuple(r) for r in source_db.execute("SELECT id, v FROM t ORDER BY id")]
    finally:
        live.stop()
        live_thread.join(60)


def _send_lock_queue(db: Any) -> list[bool]:
    """`granted` of each session's advisory lock on the mirror's send lock key (delivery/lane_keeper.py), in
    order: [False, True] is one holder and one waiter."""
    from cdc_pipeline.delivery.lane_keeper import send_lock
    from cdc_pipeline.postgres.session import LOCK_KEY_SQL

    return [bool(r[0]) for r in db.execute(
        "SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        f"AND ((classid::bigint << 32) | objid::bigint) = {LOCK_KEY_SQL} ORDER BY granted",
        (send_lock("mirror"),))]
