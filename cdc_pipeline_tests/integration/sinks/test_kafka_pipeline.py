"""The kafka sink in the whole pipeline: a grouped stream under concurrent writers reaches a real broker
through `deliver` killed with SIGKILL mid-stream and a broker outage; a too-large record is parked with its
group held while other keys flow. Read back with a real consumer."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import deliver, drain, wait_until
from cdc_pipeline_tests.integration.ops.test_crash_recovery import finish, spawn
from cdc_pipeline_tests.kafka_broker import TansuBroker, broker

WRITERS, KEYS_PER_WRITER, TXNS_PER_WRITER = 4, 25, 400


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[TansuBroker]:
    yield from broker(tmp_path)


def kafka_config(source_db: Database, write_config: Callable[..., PipelineConfig], bootstrap: str, topic: str,
                 **destination: Any) -> PipelineConfig:
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, ver bigint NOT NULL, note text)")
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "kafka_test", "publication": "kafka_test"},
        "spark": {"master": "local[2]"},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100},
        "delivery": {"batch_size": 300, "idle_seconds": 0.5},
        "tables": [{"name": "public.acct"}],
        "sinks": [{"name": "kafka", "tables": ["public.acct"],
                   "destination": {"type": "kafka", "bootstrap_servers": bootstrap, "topic": topic,
                                   **destination}}],
    })
    setup(config)
    return config


def write(dsn: str, wid: int, seed: int, errors: list[BaseException]) -> None:
    """Inserts then updates of this writer's own keys, `ver` rising per key, 1-3 rows per transaction."""
    rng = random.Random(seed)
    keys = [wid * 1000 + k for k in range(KEYS_PER_WRITER)]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO acct SELECT k, 0 FROM unnest(%s::int[]) k", (keys,))
            for _ in range(TXNS_PER_WRITER):
                with conn.transaction():
                    for k in rng.sample(keys, rng.randint(1, 3)):
                        conn.execute("UPDATE acct SET ver = ver + 1 WHERE id = %s", (k,))
                time.sleep(rng.uniform(0, 0.01))
    except BaseException as exc:
        errors.append(exc)


def offsets(config: PipelineConfig) -> tuple[tuple[int, int], str | None, int, tuple[int, int]]:
    """(the sink's offset, its waiting reason, parked messages, the log's last position)."""
    with psycopg.connect(config.state_dsn) as conn:
        lsn, idx, waiting = conn.execute("SELECT commit_lsn, commit_idx, waiting_reason FROM cdc_pipeline.sink_offsets "
                                         "WHERE sink = 'kafka'").fetchone() or (0, -1, None)
        parked = conn.execute("SELECT count(*) FROM cdc_pipeline.failed_messages").fetchone()[0]
        last = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log "
                            "ORDER BY 1 DESC, 2 DESC LIMIT 1").fetchone() or (0, -1)
        return (lsn, idx), waiting, parked, tuple(last)


def all_records(kafka: TansuBroker, topic: str) -> list[dict]:
    return sorted(kafka.records(topic), key=lambda r: (r["partition"], r["offset"]))


def test_grouped_stream_survives_deliver_sigkill_and_a_broker_outage(
        source_db: Database, write_config: Callable[..., PipelineConfig], kafka: TansuBroker) -> None:
    topic = "cdc.acct"
    kafka.create_topic(topic, partitions=3)
    config = kafka_config(source_db, write_config, kafka.bootstrap, topic)
    errors: list[BaseException] = []
    writers = [threading.Thread(target=write, args=(source_db.dsn, w, w, errors)) for w in range(WRITERS)]
    for w in writers:
        w.start()
    drainer = spawn(config, "drain", "--seconds", "600")
    deliverer = spawn(config, "deliver", "--seconds", "600")
    consumed: list[dict] = []
    try:
        # 1. SIGKILL `deliver` once it has delivered some batches, with writes still coming.
        wait_until(lambda: offsets(config)[0][0] > 0 and deliverer.poll() is None, 120, "deliver to make progress")
        os.killpg(deliverer.pid, signal.SIGKILL)
        deliverer.wait(10)
        consumed += all_records(kafka, topic)
        assert consumed, "nothing reached the broker before the kill"
        # 2. The broker goes away (memory storage: what it held is in `consumed`); delivery waits, parks nothing.
        kafka.stop()
        deliverer = spawn(config, "deliver", "--seconds", "600")
        wait_until(lambda: offsets(config)[1] is not None, 120, "deliver to wait for the broker")
        assert offsets(config)[2] == 0
        kafka.start()
        kafka.create_topic(topic, partitions=3)
        for w in writers:
            w.join(120)
        assert not errors, errors
        os.killpg(drainer.pid, signal.SIGTERM)
        assert finish(drainer, 60)[0] == 0
        drain(config)  # the log is complete
        wait_until(lambda: offsets(config)[0] == offsets(config)[3], 180, "deliver to catch up")
        os.killpg(deliverer.pid, signal.SIGTERM)
        rc, out, err = finish(deliverer, 60)
        assert rc == 0, err[-2000:]
        consumed += all_records(kafka, topic)
    finally:
        for proc in (drainer, deliverer):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert offsets(config)[1:3] == (None, 0)  # no longer waiting; nothing parked

    with psycopg.connect(config.state_dsn) as conn:
        logged = {f"{lsn}:{idx}" for lsn, idx in conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log")}
    first: dict[str, bytes] = {}
    versions: dict[bytes, list[int]] = {}
    for r in consumed:
        key = r["headers"]["idempotency_key"].decode()
        if key in first:  # a duplicate: only ever a repeat of the same message
            assert first[key] == r["value"]
            continue
        first[key] = r["value"]
        message = json.loads(r["value"])
        assert r["key"] == f"public|acct|[{message['record']['id']}]".encode()
        versions.setdefault(r["key"], []).append(message["record"]["ver"])
    assert set(first) == logged  # nothing missing, nothing extra
    assert len(logged) > WRITERS * (KEYS_PER_WRITER + TXNS_PER_WRITER)
    final = {f"public|acct|[{k}]".encode(): v for k, v in source_db.execute("SELECT id, ver FROM acct")}
    assert set(versions) == set(final)
    for key, seen in versions.items():  # per key: every version once, in order, up to the source's
        assert seen == list(range(final[key] + 1)), (key, seen[:20])
    print(f"{len(consumed)} records consumed for {len(first)} changes")


def test_too_large_record_is_parked_and_holds_only_its_key(
        source_db: Database, write_config: Callable[..., PipelineConfig], kafka: TansuBroker, spark: Any) -> None:
    topic = "cdc.big"
    kafka.create_topic(topic, partitions=2)
    config = kafka_config(source_db, write_config, kafka.bootstrap, topic, max_message_bytes=20_000)
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
    source_db.execute("UPDATE acct SET ver = 1, note = repeat('x', 50000) WHERE id = 3")  # too large
    source_db.execute("UPDATE acct SET ver = 2, note = 'small' WHERE id = 3")  # held behind it
    source_db.execute("UPDATE acct SET ver = ver + 1 WHERE id <> 3")
    drain(config)
    stats = deliver(config, spark, sink="kafka")
    assert stats.delivered == 19 and stats.parked == 2
    with psycopg.connect(config.state_dsn) as conn:
        parked = conn.execute("SELECT commit_lsn, last_error FROM cdc_pipeline.failed_messages ORDER BY 1").fetchall()
    assert len(parked) == 2 and "MSG_SIZE_TOO_LARGE" in parked[0][1]
    records = kafka.records(topic, 19)
    assert len(records) == 19
    key3 = [json.loads(r["value"])["record"]["ver"] for r in records if r["key"] == b"public|acct|[3]"]
    assert key3 == [0]  # its insert; the too-large update and the one after it wait
    others = {r["key"] for r in records if json.loads(r["value"])["record"]["ver"] == 1}
    assert len(others) == 9  # every other key flowed
