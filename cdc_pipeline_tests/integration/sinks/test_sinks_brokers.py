"""Broker sinks (Redis Streams, NATS JetStream, RabbitMQ) against the real servers on this machine.

Every test uses its own stream key / subject / stream / exchange / queue (uuid) and removes them.
What every sink type must do (order, a poison message, an outage, a SIGKILL, an unreachable server) is the
contract suite's (test_contract.py); here, what these brokers do of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import nats
import pika
import pytest
import redis

from cdc_pipeline.config import NatsDestination, RabbitMQDestination, RedisStreamDestination
from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import (
    OutboundMessage,
    Sink,
    SinkConfigError,
)
from cdc_pipeline.sinks.nats.client import NatsSink
from cdc_pipeline.sinks.rabbitmq.client import RabbitMQSink
from cdc_pipeline.sinks.redis_stream.client import RedisStreamSink

REDIS_PORT = int(os.environ.get("CDC_TEST_REDIS_PORT", "6379"))
NATS_PORT = int(os.environ.get("CDC_TEST_NATS_PORT", "4222"))
AMQP_PORT = int(os.environ.get("CDC_TEST_AMQP_PORT", "5672"))
REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
NATS_URL = f"nats://127.0.0.1:{NATS_PORT}"
AMQP_URL = f"amqp://guest:guest@127.0.0.1:{AMQP_PORT}/%2F"
CLOSED_PORT = 1  # nothing listens on port 1


def sink_config(destination: Any) -> SimpleNamespace:
    return SimpleNamespace(name=f"test_{uuid.uuid4().hex[:6]}", destination=destination)


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def messages(n: int, groups: int = 5, route: str | None = None, start: int = 0) -> list[OutboundMessage]:
    """Messages shaped like the pipeline's, with non-ASCII text so byte fidelity is checked."""
    out = []
    for i in range(start, start + n):
        payload = {
            "record": {"id": i, "name": f"naïve café №{i} ✓", "amount": i * 1.5},
            "changes": None,
            "action": "insert",
            "metadata": {"table_schema": "public", "table_name": "orders", "commit_lsn": 1000 + i,
                         "commit_idx": i, "idempotency_key": f"1000:{i}"},
        }
        out.append(OutboundMessage(key=f"{1000 + i}:{i}", group=f"g{i % groups}" if groups else None,
                                   route=route, payload=json.dumps(payload, separators=(",", ":"),
                                                                   ensure_ascii=False).encode()))
    return out






# -- build_sink -------------------------------------------------------------------------------------

def test_build_sink_dispatches_on_destination_type() -> None:
    assert isinstance(build_sink(sink_config(RedisStreamDestination())), RedisStreamSink)
    assert isinstance(build_sink(sink_config(NatsDestination())), NatsSink)
    assert isinstance(build_sink(sink_config(RabbitMQDestination())), RabbitMQSink)
    with pytest.raises(ValueError, match="unknown destination type 'pulsar'"):  # kafka is a sink now
        build_sink(sink_config(SimpleNamespace(type="pulsar")))


# -- Redis Streams --------------------------------------------------------------------------------

@pytest.fixture
def rdb() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    keys: list[str] = []
    client.test_keys = keys  # type: ignore[attr-defined]
    yield client
    if keys:
        client.delete(*keys)
    client.close()


def test_redis_batch_arrives_complete_in_order(rdb: redis.Redis) -> None:
    key, other = unique("cdc:test:"), unique("cdc:test:")
    rdb.test_keys += [key, other]  # type: ignore[attr-defined]
    batch = messages(500, groups=7)
    for m in batch[::10]:
        m.route = other  # a per-message route to another stream key
    with build_sink(sink_config(RedisStreamDestination(url=REDIS_URL, stream_key=key))) as sink:
        assert sink.deliver(batch) == [None] * len(batch)
    for stream, expected in ((key, [m for m in batch if m.route is None]), (other, batch[::10])):
        entries = rdb.xrange(stream)
        assert [(f[b"key"].decode(), f[b"data"]) for _, f in entries] == [(m.key, m.payload) for m in expected]
        assert json.loads(entries[0][1][b"data"])["record"]["name"].startswith("naïve café")


def test_redis_maxlen_trims_approximately(rdb: redis.Redis) -> None:
    key = unique("cdc:test:")
    rdb.test_keys.append(key)  # type: ignore[attr-defined]
    with build_sink(sink_config(RedisStreamDestination(url=REDIS_URL, stream_key=key, maxlen=50))) as sink:
        batch = messages(2000)
        assert sink.deliver(batch) == [None] * 2000
    length = rdb.xlen(key)
    assert 50 <= length < 2000
    last = rdb.xrevrange(key, count=1)[0][1]
    assert last[b"key"].decode() == batch[-1].key  # trimming drops the oldest, never the newest








# -- NATS JetStream -----------------------------------------------------------------------------------

async def _nats(fn: Any) -> Any:
    nc = await nats.connect(NATS_URL)
    try:
        return await fn(nc, nc.jetstream())
    finally:
        await nc.close()


def nats_run(fn: Any) -> Any:
    return asyncio.run(_nats(fn))


def nats_read(stream: str) -> list[tuple[str, dict[str, str], bytes]]:
    async def read(nc: Any, js: Any) -> list[tuple[str, dict[str, str], bytes]]:
        info = await js.stream_info(stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            out.append((msg.subject, msg.headers or {}, msg.data))
        return out

    return nats_run(read)


@pytest.fixture
def jetstream() -> Iterator[tuple[str, str]]:
    """A unique (subject, stream) pair; the stream is deleted afterwards if a test created it."""
    subject, stream = unique("cdc.t"), unique("CDC_T")
    yield subject, stream

    async def drop(nc: Any, js: Any) -> None:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)

    nats_run(drop)


def test_nats_creates_stream_and_batch_arrives_complete_in_order(jetstream: tuple[str, str]) -> None:
    subject, stream = jetstream
    batch = messages(1000, groups=9)
    for m in batch[::7]:
        m.route = f"{subject}.public.orders"  # captured by the created stream's `subject.>`
    with build_sink(sink_config(NatsDestination(url=NATS_URL, subject=subject, stream=stream))) as sink:
        assert sink.deliver(batch) == [None] * len(batch)
    got = [(s, h.get("Nats-Msg-Id"), d) for s, h, d in nats_read(stream)]
    want = [(m.route or subject, m.key, m.payload) for m in batch]
    # Pipelined across groups, one at a time within a group: each group's messages in order.
    assert sorted(got) == sorted(want)
    for g in {m.group for m in batch}:
        keys = {m.key for m in batch if m.group == g}
        assert [k for _, k, _ in got if k in keys] == [k for _, k, _ in want if k in keys]

    async def config(nc: Any, js: Any) -> Any:
        return (await js.stream_info(stream)).config

    assert sorted(nats_run(config).subjects) == sorted([subject, f"{subject}.>"])


def test_nats_redelivery_is_deduplicated_by_the_server(jetstream: tuple[str, str]) -> None:
    subject, stream = jetstream
    batch = messages(300)
    with build_sink(sink_config(NatsDestination(url=NATS_URL, subject=subject, stream=stream))) as sink:
        assert sink.deliver(batch) == [None] * 300
        assert sink.deliver(batch[100:]) == [None] * 200  # acknowledged: the server already holds them
        assert sink.deliver(messages(5, start=300)) == [None] * 5
    assert [h["Nats-Msg-Id"] for _, h, _ in nats_read(stream)] == [m.key for m in messages(305)]


def test_nats_leaves_an_existing_stream_alone(jetstream: tuple[str, str]) -> None:
    subject, stream = jetstream

    async def create(nc: Any, js: Any) -> None:
        await js.add_stream(name=stream, subjects=[f"{subject}.>", "other." + subject], max_msgs=1000)

    nats_run(create)
    with build_sink(sink_config(NatsDestination(url=NATS_URL, subject=f"{subject}.x", stream=stream))) as sink:
        assert sink.deliver(messages(3)) == [None] * 3

    async def config(nc: Any, js: Any) -> Any:
        return (await js.stream_info(stream)).config

    cfg = nats_run(config)
    assert cfg.subjects == [f"{subject}.>", "other." + subject] and cfg.max_msgs == 1000


def test_nats_existing_stream_without_the_subject_is_a_config_error(jetstream: tuple[str, str]) -> None:
    subject, stream = jetstream

    async def create(nc: Any, js: Any) -> None:
        await js.add_stream(name=stream, subjects=["other." + subject])

    nats_run(create)
    sink = build_sink(sink_config(NatsDestination(url=NATS_URL, subject=subject, stream=stream)))
    with pytest.raises(SinkConfigError, match="no JetStream stream captures subject"):
        sink.open()




def test_nats_ack_timeout_is_a_per_message_error(jetstream: tuple[str, str]) -> None:
    subject, stream = jetstream
    silent = unique("silent.")  # a plain subscriber that never answers: the publish gets no PubAck

    async def scenario(nc: Any, js: Any) -> list[str | None]:
        await nc.subscribe(silent)
        await nc.flush()
        sink = build_sink(sink_config(NatsDestination(url=NATS_URL, subject=subject, stream=stream,
                                                      ack_timeout_ms=300)))
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, sink.open)
            batch = messages(4, groups=0)
            batch[2].route = silent
            return await loop.run_in_executor(None, sink.deliver, batch)
        finally:
            await loop.run_in_executor(None, sink.close)

    started = time.monotonic()
    results = nats_run(scenario)
    assert results[:2] == [None, None] and results[3] is None
    assert results[2] is not None and "no PubAck within 300 ms" in results[2]
    assert time.monotonic() - started < 5






# -- RabbitMQ -------------------------------------------------------------------------------------

class Rabbit:
    """Test-side AMQP client: bound queues to read back with basic_get; cleans up what it declared."""

    def __init__(self) -> None:
        self.conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        self.channel = self.conn.channel()
        self.exchanges: list[str] = []
        self.queues: list[str] = []

    def bind(self, exchange: str, binding: str, exchange_type: str = "topic") -> str:
        self.channel.exchange_declare(exchange, exchange_type=exchange_type, durable=True)
        self.exchanges.append(exchange)
        queue = unique("cdc-test-q-")
        self.channel.queue_declare(queue, durable=True)
        self.queues.append(queue)
        self.channel.queue_bind(queue, exchange, binding)
        return queue

    def drain(self, queue: str) -> list[tuple[str, pika.BasicProperties, bytes]]:
        out = []
        while True:
            method, properties, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append((method.routing_key, properties, body))

    def close(self) -> None:
        channel = self.conn.channel()  # a fresh channel: a test may have had the first one closed
        for queue in self.queues:
            channel.queue_delete(queue)
        for exchange in self.exchanges:
            channel.exchange_delete(exchange)
        self.conn.close()


@pytest.fixture
def rabbit() -> Iterator[Rabbit]:
    client = Rabbit()
    yield client
    client.close()


def test_rabbitmq_batch_arrives_complete_in_order(rabbit: Rabbit) -> None:
    exchange = unique("cdc-test-x-")
    queue = rabbit.bind(exchange, "cdc.#")
    batch = messages(1000, groups=6)
    for m in batch[::9]:
        m.route = "cdc.public.orders"
    dest = RabbitMQDestination(url=AMQP_URL, exchange=exchange, routing_key="cdc.default")
    with build_sink(sink_config(dest)) as sink:
        assert sink.deliver(batch) == [None] * len(batch)
    got = rabbit.drain(queue)
    seen = [(rk, p.message_id, body) for rk, p, body in got]
    want = [(m.route or "cdc.default", m.key, m.payload) for m in batch]
    assert sorted(seen) == sorted(want)
    for g in {m.group for m in batch}:  # each group in order (pipelined across groups only)
        keys = {m.key for m in batch if m.group == g}
        assert [k for _, k, _ in seen if k in keys] == [k for _, k, _ in want if k in keys]
    assert {(p.delivery_mode, p.content_type) for _, p, _ in got} == {(2, "application/json")}


def test_rabbitmq_declares_the_exchange_durable(rabbit: Rabbit) -> None:
    exchange = unique("cdc-test-x-")
    rabbit.exchanges.append(exchange)
    with build_sink(sink_config(RabbitMQDestination(url=AMQP_URL, exchange=exchange, exchange_type="direct"))):
        pass
    # Passive redeclare with the same properties succeeds only if the sink declared it so.
    rabbit.channel.exchange_declare(exchange, exchange_type="direct", durable=True, passive=True)
    queue = rabbit.bind(exchange, "cdc", exchange_type="direct")
    with build_sink(sink_config(RabbitMQDestination(url=AMQP_URL, exchange=exchange,
                                                    exchange_type="direct"))) as sink:
        assert sink.deliver(messages(3)) == [None] * 3
    assert len(rabbit.drain(queue)) == 3




def test_rabbitmq_exchange_of_another_type_is_a_config_error(rabbit: Rabbit) -> None:
    exchange = unique("cdc-test-x-")
    rabbit.bind(exchange, "", exchange_type="fanout")
    sink = build_sink(sink_config(RabbitMQDestination(url=AMQP_URL, exchange=exchange, exchange_type="topic")))
    with pytest.raises(SinkConfigError, match="PRECONDITION_FAILED"):
        sink.open()






# -- shared behaviour -----------------------------------------------------------------------------

def _held_before_sending(sink: Sink) -> list[str | None]:
    """A message the client rejects before sending holds back its group's later messages unsent."""
    batch = messages(6, groups=2)
    batch[2].route = "bad subject with spaces" if isinstance(sink, NatsSink) else "x" * 300
    return deliver_in_order(sink, batch)


def test_client_side_rejection_holds_the_group_unsent(jetstream: tuple[str, str], rabbit: Rabbit) -> None:
    subject, stream = jetstream
    exchange = unique("cdc-test-x-")
    rabbit.bind(exchange, "#")
    for dest in (NatsDestination(url=NATS_URL, subject=subject, stream=stream),
                 RabbitMQDestination(url=AMQP_URL, exchange=exchange)):
        with build_sink(sink_config(dest)) as sink:
            results = _held_before_sending(sink)
        assert results[2] is not None and results[2] != HELD
        assert results[4] == HELD  # same group (g0), after the failure: never sent
        assert [results[i] for i in (0, 1, 3, 5)] == [None] * 4
