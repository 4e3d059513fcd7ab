"""Poison messages: parked with their group, others keep flowing, retried in order, discarded after
max_retries, managed from the CLI. The fault is real: the mirror table rejects one key."""

from __future__ import annotations

import time

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.cli import main
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config


def _prepare(source_db, dest, write_config, **sink):  # type: ignore[no-untyped-def]
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance int)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.acct"], target="mirror.acct",
                         backoff={"initial_ms": 1, "max_ms": 2, "jitter": 0}, **sink)
    config = write_config(data)
    setup(config)
    # Create the mirror up front with a constraint that rejects every version of key 7 but its first.
    dest.execute("CREATE SCHEMA mirror; CREATE TABLE mirror.acct (id int PRIMARY KEY, balance int, "
                 "CONSTRAINT poison CHECK (id <> 7 OR balance = 0))")
    return config


def _parked(config) -> list[tuple[int, int, str, int]]:  # type: ignore[no-untyped-def]
    with psycopg.connect(config.state_dsn) as conn:
        return conn.execute("SELECT commit_lsn, commit_idx, status, attempts FROM cdc_pipeline.failed_messages "
                            "ORDER BY commit_lsn, commit_idx").fetchall()


def test_poison_key_is_parked_others_flow_then_retried_in_order(source_db, db_factory, write_config, spark,
                                                                capsys):
    dest = db_factory()
    config = _prepare(source_db, dest, write_config)
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 20) g")
    for i in range(1, 4):  # three updates of every key, each in its own transaction
        source_db.execute("UPDATE acct SET balance = %s", (i,))
    drain(config)
    stats = deliver(config, spark)
    assert stats.parked == 3  # key 7's three updates: the first failed, the other two held behind it
    parked = _parked(config)
    assert parked[0][3] >= 1 and [p[3] for p in parked[1:]] == [0, 0]  # head failed; the rest held
    # Every other key is fully delivered; key 7 stays at its last good version.
    rows = dict(dest.execute("SELECT id, balance FROM mirror.acct"))
    assert all(rows[k] == 3 for k in rows if k != 7) and len(rows) == 20
    assert rows[7] == 0
    # Retries keep failing while the fault lasts; order within the key holds (nothing applied).
    deliver(config, spark)
    assert dict(dest.execute("SELECT id, balance FROM mirror.acct"))[7] == 0

    assert main(["--config", str(config.path), "failed", "list"]) == 0
    assert "group=" in capsys.readouterr().out
    dest.execute("ALTER TABLE mirror.acct DROP CONSTRAINT poison")
    assert main(["--config", str(config.path), "failed", "retry", "--all"]) == 0
    stats = deliver(config, spark)
    assert stats.retried == 3
    assert _parked(config) == []
    assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct")


def test_max_retries_discards_and_lists(source_db, db_factory, write_config, spark, capsys):
    dest = db_factory()
    config = _prepare(source_db, dest, write_config, max_retries=2)
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
    source_db.execute("UPDATE acct SET balance = 1 WHERE id IN (6, 7)")
    drain(config)
    deliver(config, spark)
    for _ in range(4):
        deliver(config, spark)  # due immediately (backoff of a few ms): retry 1, retry 2, then discard
        time.sleep(0.05)
    parked = _parked(config)
    assert [p[2] for p in parked] == ["discarded"]
    assert main(["--config", str(config.path), "failed", "list", "--json"]) == 0
    assert '"discarded"' in capsys.readouterr().out
    rows = dict(dest.execute("SELECT id, balance FROM mirror.acct"))
    assert rows[6] == 1 and rows[7] == 0


def test_crash_before_parking_loses_nothing(source_db, db_factory, write_config, spark, monkeypatch):
    """The sink applied the good messages one by one and rejected key 7; the process dies before the state
    database records the parked message. The restart must not resume past it."""
    import pytest

    from cdc_pipeline.state.failed_messages import FailedMessages

    dest = db_factory()
    config = _prepare(source_db, dest, write_config)
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
    drain(config)
    deliver(config, spark)  # the inserts, all fine
    source_db.execute("UPDATE acct SET balance = 1")  # key 7 fails here; keys 8-10 succeed after it
    drain(config)
    with monkeypatch.context() as m:
        def crash(*args: object, **kwargs: object) -> None:
            raise SystemExit("killed before the state commit")  # a fault that cannot be timed for real

        m.setattr(FailedMessages, "park", crash)
        with pytest.raises(SystemExit):
            deliver(config, spark)
    assert _parked(config) == []
    deliver(config, spark)  # the restart
    parked = _parked(config)
    assert len(parked) == 1 and parked[0][2] == "parked"
    rows = dict(dest.execute("SELECT id, balance FROM mirror.acct"))
    assert rows[7] == 0 and all(v == 1 for k, v in rows.items() if k != 7)


def test_crash_between_sink_and_state_commit_keeps_held_messages(source_db, db_factory, write_config, spark,
                                                                 monkeypatch):
    """Key 7's second update is held behind its parked first one while keys 8-10 are applied after it.
    The process dies after the mirror's commit, before the state commit parks the held message: the
    mirror's recorded position must not have passed it (issue 9.2)."""
    import pytest

    from cdc_pipeline.state.sink_offsets import SinkOffsets

    dest = db_factory()
    config = _prepare(source_db, dest, write_config)
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
    drain(config)
    deliver(config, spark)
    source_db.execute("UPDATE acct SET balance = 1")  # key 7 fails and is parked
    drain(config)
    deliver(config, spark)
    assert [p[2] for p in _parked(config)] == ["parked"]
    source_db.execute("UPDATE acct SET balance = 2")  # key 7's version is held, the others applied
    drain(config)
    with monkeypatch.context() as m:
        def crash(*args: object, **kwargs: object) -> None:
            raise SystemExit("killed between the mirror's commit and the state commit")

        m.setattr(SinkOffsets, "advance_offset", crash)
        with pytest.raises(SystemExit):
            deliver(config, spark)
    assert dict(dest.execute("SELECT id, balance FROM mirror.acct"))[10] == 2  # the mirror committed
    deliver(config, spark)  # the restart: key 7's held version is parked now, not skipped
    assert len(_parked(config)) == 2
    dest.execute("ALTER TABLE mirror.acct DROP CONSTRAINT poison")
    assert main(["--config", str(config.path), "failed", "retry", "--all"]) == 0
    deliver(config, spark)
    assert _parked(config) == []
    assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct")


def test_rolled_back_table_sync_is_done_again(source_db, db_factory, write_config, spark):
    """The first batch adds the mirror's missing column and is rolled back by one bad row: later
    messages must still apply (the sink must not remember the rolled-back ALTER TABLE; issue 9.3)."""
    dest = db_factory()
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance int)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.acct"], target="mirror.acct",
                                        backoff={"initial_ms": 60000, "max_ms": 60000}))
    setup(config)
    dest.execute("CREATE SCHEMA mirror; CREATE TABLE mirror.acct (id int PRIMARY KEY, CONSTRAINT poison CHECK (id <> 7))")
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
    drain(config)
    stats = deliver(config, spark)
    assert stats.parked == 1 and stats.delivered == 9
    source_db.execute("UPDATE acct SET balance = 5 WHERE id <> 7")
    drain(config)
    assert deliver(config, spark).delivered == 9
    rows = dict(dest.execute("SELECT id, balance FROM mirror.acct"))
    assert rows == {i: 5 for i in range(1, 11) if i != 7}


def test_max_retries_zero_discards_at_once_and_retry_all_keeps_discarded(source_db, db_factory, write_config, spark,
                                                                         capsys):
    """`max_retries: 0` discards on the first failure (1 would retry once); `failed retry --all` revives
    parked messages only, discarded ones need --include-discarded, which warns (issue 9 smaller, 9.16)."""
    dest = db_factory()
    config = _prepare(source_db, dest, write_config, max_retries=0)
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
    source_db.execute("UPDATE acct SET balance = 1 WHERE id IN (6, 7)")
    drain(config)
    deliver(config, spark)
    assert [(p[2], p[3]) for p in _parked(config)] == [("discarded", 1)]
    dest.execute("ALTER TABLE mirror.acct DROP CONSTRAINT poison")
    assert main(["--config", str(config.path), "failed", "retry", "--all"]) == 0
    assert "0 message(s) due for retry now" in capsys.readouterr().out
    deliver(config, spark)
    assert [p[2] for p in _parked(config)] == ["discarded"]
    assert dict(dest.execute("SELECT id, balance FROM mirror.acct"))[7] == 0
    assert main(["--config", str(config.path), "failed", "retry", "--all", "--include-discarded"]) == 0
    captured = capsys.readouterr()
    assert "1 message(s) due for retry now" in captured.out and "warning: 1 discarded" in captured.err
    deliver(config, spark)
    assert _parked(config) == []
    assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct")
