"""A transform that fails on one message parks that message (and its group), not the batch."""

from __future__ import annotations

import json

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import deliver, drain


def test_transform_error_on_one_row_parks_only_its_group(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "iso", "publication": "iso"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 200},
        "tables": [{"name": "public.items"}],
        "sinks": [{
            "name": "log", "tables": ["public.items"],
            # ANSI division by zero for item 13 only: a real per-row runtime failure in Spark.
            "transform": {"id": "record.id", "ratio": "100 / (record.id - 13)", "action": "action"},
            "backoff": {"initial_ms": 60000, "max_ms": 60000},
            "destination": {"type": "postgres", "dsn": dest.dsn, "table": "out.items", "mode": "append"},
        }],
    })
    setup(config)
    source_db.execute("INSERT INTO items SELECT g, 1 FROM generate_series(1, 40) g")
    source_db.execute("UPDATE items SET qty = 2")
    drain(config)
    stats = deliver(config, spark, sink="log")
    assert stats.parked == 2  # item 13's insert failed; its update is held behind it
    with psycopg.connect(dest.dsn) as conn:
        got = [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in conn.execute(
            "SELECT message FROM out.items ORDER BY commit_lsn, commit_idx").fetchall()]
    assert sorted({m["id"] for m in got}) == [i for i in range(1, 41) if i != 13]
    assert len(got) == 78
    with psycopg.connect(config.state_dsn) as conn:
        parked = conn.execute("SELECT attempts, last_error FROM cdc_pipeline.failed_messages "
                              "ORDER BY commit_lsn, commit_idx").fetchall()
    assert parked[0][0] == 1 and "transform failed" in parked[0][1] and "DIVIDE_BY_ZERO" in parked[0][1]
    assert parked[1][0] == 0 and "held behind" in parked[1][1]


def _failed(config):  # type: ignore[no-untyped-def]
    with psycopg.connect(config.state_dsn) as conn:
        return conn.execute("SELECT (c.record->>'id')::int, f.group_key, f.attempts, f.last_error "
                            "FROM cdc_pipeline.failed_messages f JOIN cdc_pipeline.change_log c "
                            "USING (commit_lsn, commit_idx) ORDER BY f.commit_lsn, f.commit_idx").fetchall()


def _delivered(dest) -> list[int]:  # type: ignore[no-untyped-def]
    with psycopg.connect(dest.dsn) as conn:
        return [int(r[0]) for r in conn.execute(
            "SELECT message->>'id' FROM out.items ORDER BY commit_lsn, commit_idx").fetchall()]


def test_transform_failure_is_parked_under_its_group_columns_group(source_db, db_factory, write_config, spark):
    """Item 13 fails the transform; item 20 shares its account (group_columns): item 20's later change must
    wait behind item 13's, not overtake it (issue 9.14)."""
    dest = db_factory()
    source_db.execute("CREATE TABLE items (id int PRIMARY KEY, account int, qty int)")
    source_db.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # deletes carry the account too
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "grp", "publication": "grp"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 200},
        "tables": [{"name": "public.items", "group_columns": ["account"]}],
        "sinks": [{
            "name": "log", "tables": ["public.items"],
            "transform": {"id": "record.id", "ratio": "100 / (record.id - 13)", "action": "action"},
            "backoff": {"initial_ms": 60000, "max_ms": 60000},
            "destination": {"type": "postgres", "dsn": dest.dsn, "table": "out.items", "mode": "append"},
        }],
    })
    setup(config)
    source_db.execute("INSERT INTO items SELECT g, g % 7, 1 FROM generate_series(1, 30) g")  # 13 and 20: account 6
    source_db.execute("UPDATE items SET qty = 2 WHERE id = 20")
    drain(config)
    deliver(config, spark, sink="log")
    failed = _failed(config)
    assert [f[0] for f in failed] == [13, 20, 27, 20]  # 13 failed; its account's later changes wait
    assert failed[0][1] == '["6"]' and failed[0][2] == 1 and "DIVIDE_BY_ZERO" in failed[0][3]
    assert all(f[1] == '["6"]' and f[2] == 0 for f in failed[1:])
    assert 20 not in _delivered(dest) and 6 in _delivered(dest)  # 6 came before the failure: it went


def test_bisection_budget_spent_parks_the_rest_instead_of_failing(source_db, db_factory, write_config, spark,
                                                                  monkeypatch):
    """Every fourth row fails the transform: more than the bisection budget can isolate. The run parks what
    it could not isolate (not counted against retries) instead of failing, and loses nothing (issue 9.12)."""
    from cdc_pipeline.delivery import staging

    monkeypatch.setattr(staging, "MAX_STAGE_SPLITS", 12)  # short in tests
    dest = db_factory()
    source_db.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "budget", "publication": "budget"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 200},
        "tables": [{"name": "public.items"}],
        "sinks": [{
            "name": "log", "tables": ["public.items"],
            "transform": {"id": "record.id", "ratio": "100 / (record.id % 4)", "action": "action"},
            "backoff": {"initial_ms": 60000, "max_ms": 60000},
            "destination": {"type": "postgres", "dsn": dest.dsn, "table": "out.items", "mode": "append"},
        }],
    })
    setup(config)
    source_db.execute("INSERT INTO items SELECT g, 1 FROM generate_series(1, 200) g")
    drain(config)
    stats = deliver(config, spark, sink="log")
    failed = _failed(config)
    delivered = _delivered(dest)
    assert sorted(delivered + [f[0] for f in failed]) == list(range(1, 201))  # nothing lost
    assert all(i % 4 for i in delivered) and delivered  # isolated healthy rows went through
    not_isolated = [f for f in failed if "bisection budget spent" in f[3]]
    assert not_isolated and all(f[2] == 0 for f in not_isolated)
    assert stats.parked == len(failed)
