"""The sqs, sns, kinesis and typesense sinks as the engine drives them (delivery/schedule/dispatch.py), against a plain
client loop on the same server: the server's own ceiling for one sender.

    python bench/reach.py                                  # every sink
    python bench/reach.py --sinks sqs,typesense --messages 2000 --typesense-messages 20000

Servers run in processes of their own (moto's `moto_server`, `typesense-server`), so neither shares the
client's GIL. Messages are ~250 bytes, grouped over 1,000 groups (a FIFO queue's group, a partition key,
a document id), handed over in calls of --call messages. The plain loop sends the same messages with the
same client library, one batch request after another (SQS/SNS: 10, Kinesis: 500, Typesense: 100), with
no group order to keep. Every message must be acknowledged, else the run fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3  # noqa: E402
import httpx  # noqa: E402

from bench._common import VENV_BIN, cpu_busy, machine, table  # noqa: E402
from bench.sinks import make_messages  # noqa: E402
from cdc_pipeline.config.destinations import DESTINATION_MODELS  # noqa: E402
from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order  # noqa: E402
from cdc_pipeline.sinks import build_sink  # noqa: E402
from cdc_pipeline.sinks.base import OutboundMessage  # noqa: E402
from cdc_pipeline_tests.servers import TYPESENSE_KEY, TypesenseServer, free_port, unique  # noqa: E402

AWS = {"region": "us-east-1", "access_key_id": "bench", "secret_access_key": "bench-secret", "timeout_ms": 120_000}


@contextmanager
def moto_process() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "moto_server did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def boto(service: str, url: str) -> Any:
    from botocore.config import Config

    return boto3.client(service, endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench",
                        aws_secret_access_key="bench-secret", config=Config(read_timeout=120))


def through_sink(destination: dict[str, Any], batch: list[OutboundMessage], call: int) -> float:
    """msgs/s from the sink's first call to its last (its start-up, the client library's import and
    connection, is timed apart: `opened`)."""
    kind = destination["type"]
    dest = DESTINATION_MODELS[kind](**destination)
    started = time.monotonic()
    with build_sink(SimpleNamespace(name=unique("bench"), destination=dest), {}) as sink:
        opened.append((kind, time.monotonic() - started))
        started = time.monotonic()
        for at in range(0, len(batch), call):
            results = deliver_in_order(sink, batch[at:at + call])
            assert all(r is None for r in results), next(r for r in results if r is not None)
        rate = len(batch) / (time.monotonic() - started)
    return rate


opened: list[tuple[str, float]] = []


def plain_loop(send: Callable[[list[OutboundMessage]], None], batch: list[OutboundMessage], size: int) -> float:
    started = time.monotonic()
    for at in range(0, len(batch), size):
        send(batch[at:at + size])
    return len(batch) / (time.monotonic() - started)


def aws_runs(url: str, n: int, n_sqs: int, call: int) -> list[tuple[str, float, float]]:
    sqs, sns, kinesis = boto("sqs", url), boto("sns", url), boto("kinesis", url)
    out = []
    batch = make_messages(n_sqs, grouped=True)
    # the same attributes the sinks send, so the server does the same work
    attrs = {"table": {"DataType": "String", "StringValue": "public.orders"},
             "action": {"DataType": "String", "StringValue": "insert"}}
    entries = lambda part: [{"Id": str(i), "MessageBody": m.payload.decode(), "MessageGroupId": m.group,  # noqa: E731
                             "MessageDeduplicationId": m.key, "MessageAttributes": {
                                 **attrs, "idempotency_key": {"DataType": "String", "StringValue": m.key}}}
                            for i, m in enumerate(part)]
    q1, q2 = (sqs.create_queue(QueueName=unique("b") + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
              for _ in range(2))
    sink = through_sink({"type": "sqs", "queue_url": q1, "endpoint_url": url, **AWS}, batch, call)
    plain = plain_loop(lambda part: _all_ok(sqs.send_message_batch(QueueUrl=q2, Entries=entries(part))), batch, 10)
    out.append((f"sqs (FIFO, {n_sqs:,} messages)", sink, plain))
    print(out[-1], flush=True)
    batch = make_messages(n, grouped=True)
    t1, t2 = (sns.create_topic(Name=unique("b") + ".fifo", Attributes={"FifoTopic": "true"})["TopicArn"]
              for _ in range(2))
    sink = through_sink({"type": "sns", "topic_arn": t1, "endpoint_url": url, **AWS}, batch, call)
    plain = plain_loop(lambda part: _all_ok(sns.publish_batch(TopicArn=t2, PublishBatchRequestEntries=[
        {"Id": str(i), "Message": e["MessageBody"], "MessageGroupId": m.group, "MessageDeduplicationId": m.key,
         "MessageAttributes": e["MessageAttributes"]} for i, (m, e) in enumerate(zip(part, entries(part), strict=True))])),
        batch, 10)
    out.append((f"sns (FIFO, {n:,} messages)", sink, plain))
    print(out[-1], flush=True)
    s1, s2 = unique("b"), unique("b")
    for s in (s1, s2):
        kinesis.create_stream(StreamName=s, ShardCount=4)
    sink = through_sink({"type": "kinesis", "stream_name": s1, "endpoint_url": url, **AWS}, batch, call)
    plain = plain_loop(lambda part: _no_failed(kinesis.put_records(StreamName=s2, Records=[
        {"Data": m.payload, "PartitionKey": m.group} for m in part])), batch, 500)
    out.append((f"kinesis (4 shards, {n:,} messages)", sink, plain))
    return out


def _all_ok(answer: dict[str, Any]) -> None:
    assert not answer.get("Failed"), answer["Failed"][:1]


def _no_failed(answer: dict[str, Any]) -> None:
    assert not answer.get("FailedRecordCount"), answer


def typesense_run(n: int, call: int) -> tuple[str, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = TypesenseServer(Path(tmp) / "data")
        server.start()
        try:
            batch = make_messages(n, grouped=True)
            sink = through_sink({"type": "typesense", "endpoint_url": server.url, "api_key": TYPESENSE_KEY,
                                 "collection_name": unique("b")}, batch, call)
            plain_name = unique("b")
            server.api("POST", "/collections", json={"name": plain_name, "fields": [{"name": ".*", "type": "auto"}]})
            client = httpx.Client(base_url=server.url, headers={"X-TYPESENSE-API-KEY": TYPESENSE_KEY}, timeout=60)
            lines = [m.payload.decode().replace('{"record":{"id":', '{"record":{"rid":', 1)[:-1] + f',"id":"{i}"}}'
                     for i, m in enumerate(batch)]

            def send(part: list[OutboundMessage]) -> None:
                first = int(part[0].key.split(":")[1])
                body = "\n".join(lines[first:first + len(part)])
                r = client.post(f"/collections/{plain_name}/documents/import", params={"action": "upsert"}, content=body)
                assert r.status_code == 200 and '"success":false' not in r.text, r.text[:300]

            plain = plain_loop(send, batch, 100)
        finally:
            server.stop()
    return (f"typesense (upsert import, {n:,} documents)", sink, plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sinks", default="aws,typesense")
    parser.add_argument("--messages", type=int, default=5000, help="messages per SNS and Kinesis run")
    parser.add_argument("--sqs-messages", type=int, default=300,
                        help="messages per SQS run (moto's FIFO queue slows down as it fills)")
    parser.add_argument("--typesense-messages", type=int, default=20000)
    parser.add_argument("--call", type=int, default=1000, help="messages per deliver() call")
    args = parser.parse_args()
    print(machine())
    print(f"CPUs busy before: {cpu_busy():.0%}")
    rows: list[tuple[str, float, float]] = []
    if "aws" in args.sinks:
        with moto_process() as url:
            rows += aws_runs(url, args.messages, args.sqs_messages, args.call)
    if "typesense" in args.sinks:
        rows.append(typesense_run(args.typesense_messages, args.call))
    print(table([(what, f"{sink:,.0f}", f"{plain:,.0f}", f"{sink / plain:.2f}") for what, sink, plain in rows],
                ("sink", "through the sink, msgs/s", "plain client loop, msgs/s", "ratio")))
    print("start-up (import, client, first request): " + ", ".join(f"{k} {s:.2f} s" for k, s in opened))


if __name__ == "__main__":
    main()
