"""Fixtures of the sink tests, and each sink type's entry in the contract suite (test_contract.py).

A sink type joins the suite with ONE fixture here, decorated `@contract_sink`, that returns (or yields) a
`SinkUnderTest` against its real server (contract.py). What a destination cannot do (a file system refuses
no row) is named with `lacks=`, with the reason: the suite's tests that need it are not generated for that
sink type (nothing is skipped). A destination that keeps each row's latest state instead of the messages
registers with `mirror=True`: the suite then compares its rows with the source where it would read the
messages back. docs/how-to/write-a-sink.md says more.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.integration.sinks.contract import POISON, Got, SinkUnderTest, parse
from cdc_pipeline_tests.netfaults import TcpProxy

REDIS_PORT = int(os.environ.get("CDC_TEST_REDIS_PORT", "6379"))
NATS_PORT = int(os.environ.get("CDC_TEST_NATS_PORT", "4222"))
AMQP_PORT = int(os.environ.get("CDC_TEST_AMQP_PORT", "5672"))
CLOSED_PORT = 1  # nothing listens on port 1

# name of a contract fixture -> what it lacks (capability -> why)
CONTRACT_SINKS: dict[str, dict[str, str]] = {}


_KEEPS = {True: {"history": "a mirror keeps each row's latest state, not the messages"},
          False: {"mirror": "keeps the messages: the history tests read them back one by one"}}


def contract_sink(fn: Callable[..., Any] | None = None, *, lacks: dict[str, str] | None = None,
                  mirror: bool = False) -> Any:
    """Register a fixture as a sink type of the contract suite (`lacks`: capabilities it has not, and why;
    `mirror`: it keeps rows, not messages)."""
    def register(f: Callable[..., Any]) -> Any:
        CONTRACT_SINKS[f.__name__] = {**(lacks or {}), **_KEEPS[mirror]}
        return pytest.fixture(f)

    return register(fn) if fn is not None else register


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`sut` runs over every registered sink type that has what the test's `contract` mark needs."""
    if "sut" not in metafunc.fixturenames:
        return
    needs = {cap for mark in metafunc.definition.iter_markers("contract") for cap in mark.args}
    names = [name for name, lacks in CONTRACT_SINKS.items() if not needs & set(lacks)]
    metafunc.parametrize("sut", names, indirect=True, ids=[name.removesuffix("_sink") for name in names])


@pytest.fixture
def sut(request: pytest.FixtureRequest) -> SinkUnderTest:
    found: SinkUnderTest = request.getfixturevalue(request.param)
    return found


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def poison_route(target: str) -> Callable[[dict[str, Any]], None]:
    """Row POISON's messages routed to `target`, which the destination refuses."""
    def poison(entry: dict[str, Any]) -> None:
        entry["route"] = f"CASE WHEN record.id = {POISON} THEN '{target}' END"

    return poison


@contextlib.contextmanager
def cut(proxy: TcpProxy) -> Iterator[None]:
    proxy.stop()
    try:
        yield
    finally:
        proxy.start()


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[int], TcpProxy]]:
    made: list[TcpProxy] = []

    def make(port: int) -> TcpProxy:
        proxy = TcpProxy(port).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


# -- the sink types of the contract suite, one fixture each ----------------------------------------------

@contract_sink
def redis_stream_sink(proxy_factory: Callable[[int], TcpProxy]) -> Iterator[SinkUnderTest]:
    import redis

    client = redis.Redis(port=REDIS_PORT)
    key, wrong = unique("cdc:contract:"), unique("cdc:contract:")
    client.set(wrong, "a string, not a stream")  # XADD to it: WRONGTYPE
    proxy = proxy_factory(REDIS_PORT)
    yield SinkUnderTest(
        destination=lambda: {"type": "redis_stream", "url": f"redis://127.0.0.1:{proxy.port}/0", "stream_key": key},
        received=lambda: [Got(parse(f[b"data"]), f[b"key"].decode()) for _, f in client.xrange(key)],
        poison=poison_route(wrong), outage=lambda: cut(proxy),
        unreachable=lambda: {"type": "redis_stream", "url": f"redis://:hunter2@127.0.0.1:{CLOSED_PORT}/0"},
        secret="hunter2")
    client.delete(key, wrong)
    client.close()


@contract_sink
def nats_sink(proxy_factory: Callable[[int], TcpProxy]) -> Iterator[SinkUnderTest]:
    import asyncio

    import nats as nats_py

    subject, stream = unique("cdc.contract."), unique("CDC_CONTRACT_")
    proxy = proxy_factory(NATS_PORT)

    async def read() -> list[Got]:
        nc = await nats_py.connect(f"nats://127.0.0.1:{NATS_PORT}")
        try:
            js = nc.jetstream()
            try:
                state = (await js.stream_info(stream)).state
            except nats_py.js.errors.NotFoundError:
                return []
            out = []
            for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
                msg = await js.get_msg(stream, seq)
                out.append(Got(parse(msg.data), (msg.headers or {}).get("Nats-Msg-Id"), dict(msg.headers or {})))
            return out
        finally:
            await nc.close()

    yield SinkUnderTest(
        destination=lambda: {"type": "nats", "url": f"nats://127.0.0.1:{proxy.port}", "subject": subject,
                             "stream": stream, "ack_timeout_ms": 2000},
        received=lambda: asyncio.run(read()),
        poison=poison_route(unique("nowhere.")),  # no stream captures it
        outage=lambda: cut(proxy), unreachable=lambda: {"type": "nats", "url": f"nats://127.0.0.1:{CLOSED_PORT}"},
        headers=lambda m: {"Nats-Msg-Id": m["metadata"]["idempotency_key"]})

    async def drop() -> None:
        nc = await nats_py.connect(f"nats://127.0.0.1:{NATS_PORT}")
        with contextlib.suppress(nats_py.js.errors.NotFoundError):
            await nc.jetstream().delete_stream(stream)
        await nc.close()

    asyncio.run(drop())


@contract_sink
def rabbitmq_sink(proxy_factory: Callable[[int], TcpProxy]) -> Iterator[SinkUnderTest]:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{AMQP_PORT}/%2F"))
    channel = conn.channel()
    exchange, queue = unique("cdc-contract-x-"), unique("cdc-contract-q-")
    channel.exchange_declare(exchange, exchange_type="topic", durable=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "cdc.#")
    proxy = proxy_factory(AMQP_PORT)
    got: list[Got] = []  # what was taken off the queue so far (basic_get removes it)

    def received() -> list[Got]:
        while True:
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return list(got)
            got.append(Got(parse(body), props.message_id, {"content_type": props.content_type,
                                                           "delivery_mode": str(props.delivery_mode)}))

    yield SinkUnderTest(
        destination=lambda: {"type": "rabbitmq", "url": f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F",
                             "exchange": exchange, "routing_key": "cdc.contract"},
        received=received, poison=poison_route("unbound.key"),  # no queue bound: returned unroutable
        outage=lambda: cut(proxy),
        unreachable=lambda: {"type": "rabbitmq", "url": f"amqp://guest:pa55word@127.0.0.1:{CLOSED_PORT}/%2F"},
        secret="pa55word", headers=lambda m: {"content_type": "application/json", "delivery_mode": "2"})
    channel.queue_delete(queue)
    channel.exchange_delete(exchange)
    conn.close()


@contract_sink
def kafka_sink(tmp_path: Path) -> Iterator[SinkUnderTest]:
    from cdc_pipeline_tests.kafka_broker import TansuBroker, free_port

    broker = TansuBroker(tmp_path)
    broker.start()
    topic = unique("cdc.contract.")
    broker.create_topic(topic, partitions=3)
    kept: list[Got] = []  # read before an outage: the broker keeps its records in memory only

    def read() -> list[Got]:
        records = sorted(broker.records(topic), key=lambda r: (r["partition"], r["offset"]))
        return [Got(parse(r["value"]), r["headers"].get("idempotency_key", b"").decode(),
                    {k: v.decode() for k, v in r["headers"].items()}) for r in records]

    @contextlib.contextmanager
    def outage() -> Iterator[None]:
        kept.extend(read())
        broker.stop()
        try:
            yield
        finally:
            broker.start()
            broker.create_topic(topic, partitions=3)

    try:
        yield SinkUnderTest(
            destination=lambda: {"type": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic,
                                 "route_prefixes": ["cdc."], "delivery_timeout_ms": 5000},
            received=lambda: kept + read(), poison=poison_route("elsewhere"),  # outside route_prefixes
            outage=outage, unreachable=lambda: {"type": "kafka", "bootstrap_servers": f"127.0.0.1:{free_port()}",
                                                "topic": "cdc"},
            headers=lambda m: {"idempotency_key": m["metadata"]["idempotency_key"], "action": m["action"],
                               "table": "public.t"},
            ordered=False)  # partitions: `received` holds each partition in order, one after the other
    finally:
        broker.stop()


@contract_sink
def webhook_sink() -> Iterator[SinkUnderTest]:
    from cdc_pipeline_tests.integration.sinks.test_sink_webhook import Receiver

    receiver = Receiver()

    def received() -> list[Got]:
        with receiver.lock:
            answered = list(receiver.requests)
        return [Got(m, None, headers) for headers, body, status in answered if 200 <= status < 300
                for m in parse(body)["data"]]

    def poison(entry: dict[str, Any]) -> None:
        def refuse(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
            poisoned = any(m["record"]["id"] == POISON for m in parse(body)["data"])
            return (422, b"cannot take it", 0.0) if poisoned else (200, b"{}", 0.0)

        receiver.behaviour = refuse
        entry["batch_size"] = 1  # a request per message: 2xx acknowledges a whole request

    @contextlib.contextmanager
    def outage() -> Iterator[None]:
        receiver.behaviour = lambda h, b: (503, b"maintenance", 0.0)
        try:
            yield
        finally:
            receiver.behaviour = lambda h, b: (200, b"{}", 0.0)

    yield SinkUnderTest(
        destination=lambda: {"type": "webhook", "url": receiver.url, "headers": {"X-Contract": "yes"},
                             "timeout_ms": 2000},
        received=received, poison=poison, outage=outage,
        unreachable=lambda: {"type": "webhook", "url": f"http://127.0.0.1:{CLOSED_PORT}/h?token=s3cr3t",
                             "timeout_ms": 2000},
        secret="s3cr3t", headers=lambda m: {"content-type": "application/json", "x-contract": "yes"})
    receiver.stop()


@contract_sink
def postgres_sink(db_factory: Callable[[], Database], proxy_factory: Callable[[int], TcpProxy]) -> SinkUnderTest:
    """Append mode: a row per message, the destination's order is its transactions' (then positions')."""
    import psycopg
    from psycopg import conninfo

    dest = db_factory()
    port = int(conninfo.conninfo_to_dict(dest.dsn).get("port") or 5432)
    proxy = proxy_factory(port)
    through = conninfo.make_conninfo(dest.dsn, host="127.0.0.1", port=proxy.port)

    def received() -> list[Got]:
        with psycopg.connect(dest.dsn) as conn:
            if conn.execute("SELECT to_regclass('sink.events')").fetchone() == (None,):
                return []
            return [Got(m, k) for k, m in conn.execute(
                "SELECT idempotency_key, message FROM sink.events ORDER BY delivered_at, commit_lsn, commit_idx")]

    return SinkUnderTest(
        destination=lambda: {"type": "postgres", "dsn": through, "table": "sink.events", "mode": "append"},
        received=received, poison=poison_route("pg_catalog.nope"),  # a system schema: refused
        outage=lambda: cut(proxy),
        unreachable=lambda: {"type": "postgres", "dsn": f"postgresql://u:pgs3cret@127.0.0.1:{CLOSED_PORT}/x",
                             "table": "sink.events", "mode": "append"},
        secret="pgs3cret")


@contract_sink(lacks={"poison": "a file system takes every row", "outage": "a local directory is not down",
                      "unreachable": "nothing to connect to",
                      # each `deliver` process starts a JVM (20 s and more on a loaded machine); a retried call
                      # replacing its own files is test_sink_parquet.py's
                      "sigkill": "a JVM per process: too slow for the suite"})
def parquet_sink(tmp_path: Path, spark: Any) -> SinkUnderTest:
    """Written through Spark; its order is positions' within each call's files (one file set per call)."""
    path = tmp_path / "lake"

    def received() -> list[Got]:
        if not path.exists():
            return []
        rows = spark.read.parquet(f"file://{path}").orderBy("commit_lsn", "commit_idx").collect()
        return [Got(parse(r["message"]), r["idempotency_key"]) for r in rows]

    return SinkUnderTest(destination=lambda: {"type": "parquet", "path": f"file://{path}"}, received=received,
                         ordered=False)


@contract_sink(lacks={"poison": "its queue takes every message", "unreachable": "nothing to connect to",
                      "outage": "its queue is in the state database: that outage is the state database's"})
def http_pull_sink(source_db: Database, monkeypatch: pytest.MonkeyPatch) -> SinkUnderTest:
    """Queued in the state database (the source's here), in the transaction that moves the offset."""
    import psycopg

    monkeypatch.setenv("CDC_CONTRACT_TOKEN", "t0ken")

    def received() -> list[Got]:
        with psycopg.connect(source_db.dsn) as conn:
            if conn.execute("SELECT to_regclass('cdc_pipeline.pull_queue')").fetchone() == (None,):
                return []
            return [Got(parse(p)) for (p,) in conn.execute(
                "SELECT payload FROM cdc_pipeline.pull_queue WHERE consumer = 's' ORDER BY id")]

    return SinkUnderTest(destination=lambda: {"type": "http_pull", "token_env": "CDC_CONTRACT_TOKEN"},
                         received=received)


# Amazon SQS (a FIFO queue), SNS (a FIFO topic read through a FIFO queue) and Kinesis (two shards, read shard
# by shard) on moto's server (moto_contract.py).

@contract_sink
def sqs_sink() -> Iterator[SinkUnderTest]:
    from cdc_pipeline_tests.integration.sinks.moto_contract import moto_contract

    yield from moto_contract("sqs")


@contract_sink
def sns_sink() -> Iterator[SinkUnderTest]:
    from cdc_pipeline_tests.integration.sinks.moto_contract import moto_contract

    yield from moto_contract("sns")


@contract_sink
def kinesis_sink() -> Iterator[SinkUnderTest]:
    from cdc_pipeline_tests.integration.sinks.moto_contract import moto_contract

    yield from moto_contract("kinesis")


@pytest.fixture(scope="session")
def typesense(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Typesense server for the session's tests (each test its own collections)."""
    from cdc_pipeline_tests.servers import typesense_server

    yield from typesense_server(tmp_path_factory.mktemp("ts"))


@contract_sink(mirror=True)
def typesense_sink(typesense: Any, proxy_factory: Callable[[int], TcpProxy]) -> SinkUnderTest:
    """A collection of the rows, each a document by its key; row POISON's messages routed outside
    `route_prefixes`, which the sink refuses."""
    from cdc_pipeline_tests.servers import TYPESENSE_KEY

    collection = unique("cdc_contract_")
    proxy = proxy_factory(typesense.port)

    def state() -> dict[int, dict[str, Any]]:
        if collection not in {c["name"] for c in typesense.api("GET", "/collections")}:
            return {}
        return {int(k): {"g": d["g"], "v": d["v"]} for k, d in typesense.documents(collection).items()}

    return SinkUnderTest(
        destination=lambda: {"type": "typesense", "endpoint_url": f"http://127.0.0.1:{proxy.port}",
                             "api_key": TYPESENSE_KEY, "collection_name": collection,
                             "route_prefixes": ["cdc_contract_"]},
        state=state, poison=poison_route("elsewhere"), outage=lambda: cut(proxy),
        unreachable=lambda: {"type": "typesense", "endpoint_url": f"http://127.0.0.1:{CLOSED_PORT}",
                             "api_key": "ts-s3cret"},
        secret="ts-s3cret")


_LAKE_LACKS = {"poison": "every value of the suite's table (int, int, text) has an exact lake type: none is refused",
               "outage": "a local directory is not down", "unreachable": "a local directory: nothing to connect to"}


def _lake_sink(fmt: str, tmp_path: Path, config_of: Callable[[], Any]) -> SinkUnderTest:
    """Append mode: a row per message read back by the format's own reader; the message rebuilt from the row
    (the table is the source table's, so its schema and name). Its order is positions' (one commit per call)."""
    import json

    from cdc_pipeline_tests.lake import read_table

    dest = {"type": fmt, "mode": "append", "flush_seconds": 0,
            **({"path": str(tmp_path / "delta")} if fmt == "delta" else {"warehouse": f"file://{tmp_path}/wh"})}

    def received() -> list[Got]:
        try:
            table = read_table(config_of(), "public.t", "s")
        except Exception:  # no table yet: nothing delivered
            return []
        rows = sorted(table.to_pylist(), key=lambda r: (r["commit_lsn"], r["commit_idx"]))
        return [Got({"record": {"id": r["id"], "g": r["g"], "v": r["v"]},
                     "changes": json.loads(r["changes"]) if r["changes"] else None, "action": r["action"],
                     "metadata": {"table_schema": "public", "table_name": "t", "commit_lsn": r["commit_lsn"],
                                  "commit_idx": r["commit_idx"], "idempotency_key": r["idempotency_key"]}},
                    r["idempotency_key"]) for r in rows]

    return SinkUnderTest(destination=lambda: dest, received=received, ordered=False)


@contract_sink(lacks=_LAKE_LACKS)
def delta_sink(tmp_path: Path) -> SinkUnderTest:
    return _lake_sink("delta", tmp_path, lambda: _last_config(tmp_path))


@contract_sink(lacks=_LAKE_LACKS)
def iceberg_sink(tmp_path: Path) -> SinkUnderTest:
    return _lake_sink("iceberg", tmp_path, lambda: _last_config(tmp_path))


def _last_config(tmp_path: Path) -> Any:
    """The pipeline's config, as the suite's `pipeline` wrote it (the write_config fixture's file)."""
    from cdc_pipeline.config import load_config

    return load_config(str(tmp_path / "cdc.yaml"))
