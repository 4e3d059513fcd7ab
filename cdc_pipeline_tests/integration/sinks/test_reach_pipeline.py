"""The sqs, sns, kinesis and typesense sinks in the whole pipeline, each on its real server (moto's, Typesense's):
a grouped stream under concurrent writers reaches the destination through a `deliver` killed with SIGKILL
mid-stream and a server outage (waited for, nothing parked); FIFO queues and topics drop the redeliveries; a
message the destination cannot take is parked with a clear error while its row waits and others flow."""

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
from cdc_pipeline_tests.integration.sinks.test_sink_sns_kinesis import (
    fifo_topic_with_queue,
    make_stream,
    records,
)
from cdc_pipeline_tests.integration.sinks.test_sink_sqs import make_queue, received
from cdc_pipeline_tests.servers import TYPESENSE_KEY, MotoServer, TypesenseServer

WRITERS, KEYS_PER_WRITER, TXNS_PER_WRITER = 3, 8, 50  # ~340 changes: moto takes ~40 FIFO messages/s
SINK = "reach"


def write(dsn: str, wid: int, errors: list[BaseException]) -> None:
    """Inserts then updates of this writer's own keys, `ver` rising per key, 1-3 rows per transaction."""
    rng = random.Random(wid)
    keys = [wid * 1000 + k for k in range(KEYS_PER_WRITER)]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO acct SELECT k, 0 FROM unnest(%s::int[]) k", (keys,))
            for _ in range(TXNS_PER_WRITER):
                with conn.transaction():
                    for k in rng.sample(keys, rng.randint(1, 3)):
                        conn.execute("UPDATE acct SET ver = ver + 1 WHERE id = %s", (k,))
                time.sleep(rng.uniform(0, 0.02))  # spreads the writers' commits (not a synchronisation)
    except BaseException as exc:
        errors.append(exc)


class Target:
    """A destination on its real server: its config, a way to take it away and back, and what it holds."""

    destination: dict[str, Any]
    exactly_once = False  # FIFO deduplication: each change arrives once

    def stop(self) -> None: ...
    def start(self) -> None: ...

    def versions(self) -> dict[int, list[int]]:
        """Per row id, the `ver` of each change as the destination holds them (first arrivals, in order)."""
        raise NotImplementedError


class SqsTarget(Target):
    exactly_once = True

    def __init__(self, moto: MotoServer) -> None:
        self.moto = moto
        self.url = make_queue(moto)
        self.destination = {"type": "sqs", "queue_url": self.url, "timeout_ms": 60000, **moto.connection()}

    def stop(self) -> None:
        self.moto.stop()

    def start(self) -> None:
        self.moto.start()

    def bodies(self) -> list[bytes]:
        return [m["Body"].encode() for m in received(self.moto, self.url)]

    def versions(self) -> dict[int, list[int]]:
        return by_row(self.bodies())


class SnsTarget(SqsTarget):
    def __init__(self, moto: MotoServer) -> None:
        self.moto = moto
        arn, self.url = fifo_topic_with_queue(moto)
        self.destination = {"type": "sns", "topic_arn": arn, "timeout_ms": 60000, **moto.connection()}


class KinesisTarget(Target):
    def __init__(self, moto: MotoServer) -> None:
        self.moto = moto
        self.stream = make_stream(moto, 2)
        self.destination = {"type": "kinesis", "stream_name": self.stream, "timeout_ms": 60000, **moto.connection()}

    def stop(self) -> None:
        self.moto.stop()

    def start(self) -> None:
        self.moto.start()

    def versions(self) -> dict[int, list[int]]:
        got = records(self.moto, self.stream)
        keys = {}
        for r in got:  # a row's group stays on one shard
            keys.setdefault(r["key"], set()).add(r["shard"])
        assert all(len(s) == 1 for s in keys.values())
        return by_row([r["data"] for r in got])


def by_row(payloads: list[bytes]) -> dict[int, list[int]]:
    seen: dict[str, bytes] = {}
    out: dict[int, list[int]] = {}
    for payload in payloads:
        message = json.loads(payload)
        key = message["metadata"]["idempotency_key"]
        if key in seen:  # a duplicate: only ever a repeat of the same message
            assert seen[key] == payload
            continue
        seen[key] = payload
        out.setdefault(message["record"]["id"], []).append(message["record"]["ver"])
    by_row.count = len(payloads)  # type: ignore[attr-defined]
    return out


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def typesense(tmp_path: Path) -> Iterator[TypesenseServer]:
    server = TypesenseServer(tmp_path / "typesense-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def pipeline(source_db: Database, write_config: Callable[..., PipelineConfig], destination: dict[str, Any]
             ) -> PipelineConfig:
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, ver bigint NOT NULL, note text, price numeric)")
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "reach_test", "publication": "reach_test"},
        "spark": {"master": "local[2]"},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100},
        "delivery": {"batch_size": 200, "idle_seconds": 0.3, "retry_initial_ms": 200, "retry_max_ms": 1000},
        "tables": [{"name": "public.acct"}],
        "sinks": [{"name": SINK, "tables": ["public.acct"], "destination": destination}],
    })
    setup(config)
    return config


def offsets(config: PipelineConfig) -> tuple[tuple[int, int], str | None, int, tuple[int, int]]:
    """(the sink's offset, its waiting reason, parked messages, the log's last position)."""
    with psycopg.connect(config.state_dsn) as conn:
        lsn, idx, waiting = conn.execute("SELECT commit_lsn, commit_idx, waiting_reason FROM cdc_pipeline.sink_offsets "
                                         "WHERE sink = %s", (SINK,)).fetchone() or (0, -1, None)
        parked = conn.execute("SELECT count(*) FROM cdc_pipeline.failed_messages").fetchone()[0]
        last = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log "
                            "ORDER BY 1 DESC, 2 DESC LIMIT 1").fetchone() or (0, -1)
        return (lsn, idx), waiting, parked, tuple(last)


def run_through_kill_and_outage(config: PipelineConfig, target: Target, source_db: Database) -> int:
    """Writers, drain and deliver as processes; deliver SIGKILLed once it delivered, then the server stopped
    and started again while a new deliver waits for it. Returns how many changes the log holds."""
    errors: list[BaseException] = []
    writers = [threading.Thread(target=write, args=(source_db.dsn, w, errors)) for w in range(WRITERS)]
    for w in writers:
        w.start()
    drainer = spawn(config, "drain", "--seconds", "600")
    deliverer = spawn(config, "deliver", "--seconds", "600")
    try:
        wait_until(lambda: offsets(config)[0][0] > 0 and deliverer.poll() is None, 180, "deliver to make progress")
        os.killpg(deliverer.pid, signal.SIGKILL)
        deliverer.wait(10)
        target.stop()
        deliverer = spawn(config, "deliver", "--seconds", "600")
        wait_until(lambda: offsets(config)[1] is not None, 180, "deliver to wait for the server")
        assert offsets(config)[2] == 0  # nothing parked while the server is away
        target.start()
        for w in writers:
            w.join(300)
        assert not errors, errors
        os.killpg(drainer.pid, signal.SIGTERM)
        assert finish(drainer, 60)[0] == 0
        drain(config)  # the log is complete
        try:
            wait_until(lambda: offsets(config)[0] == offsets(config)[3], 240, "deliver to catch up")
        except AssertionError:
            os.killpg(deliverer.pid, signal.SIGTERM)
            raise AssertionError(f"{offsets(config)}: {finish(deliverer, 60)[2][-3000:]}") from None
        os.killpg(deliverer.pid, signal.SIGTERM)
        rc, _, err = finish(deliverer, 60)
        assert rc == 0, err[-2000:]
    finally:
        for proc in (drainer, deliverer):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert offsets(config)[1:3] == (None, 0)  # no longer waiting; nothing parked
    with psycopg.connect(config.state_dsn) as conn:
        return int(conn.execute("SELECT count(*) FROM cdc_pipeline.change_log").fetchone()[0])


@pytest.mark.parametrize("kind", ["sqs", "sns", "kinesis"])
def test_grouped_stream_survives_deliver_sigkill_and_an_outage(
        kind: str, source_db: Database, write_config: Callable[..., PipelineConfig], moto: MotoServer) -> None:
    target = {"sqs": SqsTarget, "sns": SnsTarget, "kinesis": KinesisTarget}[kind](moto)
    config = pipeline(source_db, write_config, target.destination)
    logged = run_through_kill_and_outage(config, target, source_db)
    versions = target.versions()
    final = dict(source_db.execute("SELECT id, ver FROM acct"))
    assert set(versions) == set(final)
    for row, seen in versions.items():  # per row: every version once, in order, up to the source's
        assert seen == list(range(final[row] + 1)), (row, seen[:20])
    assert sum(len(v) for v in versions.values()) == logged
    if target.exactly_once:  # the FIFO queue or topic dropped every redelivery
        assert by_row.count == logged  # type: ignore[attr-defined]


def test_typesense_mirror_survives_deliver_sigkill_and_an_outage(
        source_db: Database, write_config: Callable[..., PipelineConfig], typesense: TypesenseServer) -> None:
    config = pipeline(source_db, write_config, {"type": "typesense", "endpoint_url": typesense.url,
                                                "api_key": TYPESENSE_KEY, "timeout_seconds": 60})
    run_through_kill_and_outage(config, _Restartable(typesense), source_db)
    docs = typesense.documents("public.acct")
    assert {int(k): d["ver"] for k, d in docs.items()} == dict(source_db.execute("SELECT id, ver FROM acct"))


class _Restartable(Target):
    def __init__(self, server: TypesenseServer) -> None:
        self.server = server

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server.start()


TOO_LARGE = {"sqs": 300_000, "kinesis": 1_100_000}


@pytest.mark.parametrize("kind", ["sqs", "kinesis", "typesense"])
def test_a_message_it_cannot_take_is_parked_while_its_row_waits_and_others_flow(
        kind: str, source_db: Database, write_config: Callable[..., PipelineConfig], spark: Any,
        tmp_path: Path) -> None:
    servers: list[Any] = []
    try:
        if kind == "typesense":
            server = TypesenseServer(tmp_path / "ts")
            server.start()
            servers.append(server)
            destination = {"type": "typesense", "endpoint_url": server.url, "api_key": TYPESENSE_KEY}
            poison = "UPDATE acct SET ver = 1, price = 'NaN' WHERE id = 3"  # a float field refuses "NaN"
        else:
            moto = MotoServer()
            moto.start()
            servers.append(moto)
            target = SqsTarget(moto) if kind == "sqs" else KinesisTarget(moto)
            destination = target.destination
            poison = f"UPDATE acct SET ver = 1, note = repeat('x', {TOO_LARGE[kind]}) WHERE id = 3"
        config = pipeline(source_db, write_config, destination)
        source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
        source_db.execute(poison)
        source_db.execute("UPDATE acct SET ver = 2, note = 'small', price = 1 WHERE id = 3")  # held behind it
        source_db.execute("UPDATE acct SET ver = ver + 1 WHERE id <> 3")
        drain(config)
        stats = deliver(config, spark, sink=SINK)
        assert stats.delivered == 19 and stats.parked == 2
        with psycopg.connect(config.state_dsn) as conn:
            parked = conn.execute("SELECT last_error FROM cdc_pipeline.failed_messages ORDER BY commit_lsn").fetchall()
        expected = "must be a float" if kind == "typesense" else "message too large"
        assert expected in parked[0][0], parked
        if kind == "typesense":
            docs = server.documents("public.acct")
            assert {int(k): d["ver"] for k, d in docs.items()} == {**{i: 1 for i in range(1, 11)}, 3: 0}
        else:
            versions = target.versions()
            assert versions[3] == [0] and all(versions[i] == [0, 1] for i in range(1, 11) if i != 3)
    finally:
        for s in servers:
            s.stop()
