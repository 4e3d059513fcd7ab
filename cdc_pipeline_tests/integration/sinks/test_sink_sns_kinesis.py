"""The sns and kinesis sinks against moto's real AWS-protocol server: an SNS FIFO topic read back through an
SQS FIFO subscription (order per group, deduplication, attributes), Kinesis records read back per shard
(a group on one shard, in order), limits checked before sending, routes and outages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import SinkUnavailable, Unreachable
from cdc_pipeline.sinks.kinesis import KinesisDestination
from cdc_pipeline.sinks.sns import SnsDestination
from cdc_pipeline_tests.integration.sinks.test_sink_sqs import ids_by_group, make_queue, received
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages
from cdc_pipeline_tests.scheduled import scheduled
from cdc_pipeline_tests.servers import MotoServer, moto_server, unique


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    yield from moto_server()


def sink_of(dest: Any) -> Any:
    """The sink as the engine's calls use it (cdc_pipeline_tests/scheduled.py)."""
    return scheduled(build_sink(SimpleNamespace(name=unique("s"), destination=dest), {}), dest)


def fifo_topic_with_queue(moto: MotoServer) -> tuple[str, str]:
    """A FIFO topic and a FIFO queue subscribed to it with raw delivery (the body is the message)."""
    name = unique("t")
    arn = moto.client("sns").create_topic(Name=f"{name}.fifo", Attributes={"FifoTopic": "true"})["TopicArn"]
    url = make_queue(moto, name=f"{name}-sub.fifo")
    queue_arn = moto.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    moto.client("sns").subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn["Attributes"]["QueueArn"],
                                 Attributes={"RawMessageDelivery": "true"})
    return str(arn), url


def make_stream(moto: MotoServer, shards: int = 2) -> str:
    name = unique("s")
    client = moto.client("kinesis")
    client.create_stream(StreamName=name, ShardCount=shards)
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1})
    return name


def records(moto: MotoServer, stream: str) -> list[dict[str, Any]]:
    """Every record of the stream, shard by shard in order: dicts of shard, key, data."""
    client = moto.client("kinesis")
    out: list[dict[str, Any]] = []
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        it = client.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"],
                                       ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while it:
            got = client.get_records(ShardIterator=it, Limit=1000)
            out += [{"shard": shard["ShardId"], "key": r["PartitionKey"], "data": r["Data"]} for r in got["Records"]]
            it = got.get("NextShardIterator") if got["Records"] else None
    return out


def test_sns_fifo_topic_keeps_group_order_deduplicates_and_carries_attributes(moto: MotoServer) -> None:
    arn, url = fifo_topic_with_queue(moto)
    sent = messages(40, groups=6)
    with sink_of(SnsDestination(topic_arn=arn, **moto.connection())) as sink:
        assert sink.deliver(sent) == [None] * 40
        assert sink.deliver(sent[10:30]) == [None] * 20  # redelivered: dropped by the topic
    got = received(moto, url, 40)
    assert len(got) == 40
    assert ids_by_group(got) == {f"g{g}": list(range(g, 40, 6)) for g in range(6)}
    first = next(m for m in got if json.loads(m["Body"])["record"]["id"] == 0)
    assert first["Body"].encode() == sent[0].payload
    assert {k: v["StringValue"] for k, v in first["MessageAttributes"].items()} == {
        "idempotency_key": "1000:0", "table": "public.orders", "action": "insert"}


def test_sns_too_large_parked_routes_and_outage(moto: MotoServer) -> None:
    arn, url = fifo_topic_with_queue(moto)
    batch = messages(9, groups=3)
    big = json.loads(batch[3].payload)
    big["record"]["name"] = "x" * 270_000
    batch[3].payload = json.dumps(big).encode()  # group g0
    batch[8].route = "no such topic!"
    sink = sink_of(SnsDestination(topic_arn=arn, **moto.connection()))
    try:
        results = deliver_in_order(sink, batch)
        assert "too large" in str(results[3]) and not isinstance(results[3], Unreachable)
        assert results[6] == HELD and "invalid topic name" in str(results[8])
        assert ids_by_group(received(moto, url, 6)) == {"g0": [0], "g1": [1, 4, 7], "g2": [2, 5]}
        moto.stop()
        with pytest.raises(SinkUnavailable, match="did not answer"):
            sink.deliver(messages(3, start=20))
        moto.start()
        assert sink.deliver(messages(3, start=20)) == [None] * 3
    finally:
        sink.close()
    with pytest.raises(SinkUnavailable, match="NotFound"):
        sink_of(SnsDestination(topic_arn=arn + "-gone", **moto.connection())).open()


def test_kinesis_group_is_one_shard_in_order_and_routes(moto: MotoServer) -> None:
    stream, other = make_stream(moto), make_stream(moto, 1)
    sent = messages(300, groups=9)
    with sink_of(KinesisDestination(stream_name=stream, **moto.connection())) as sink:
        assert sink.deliver(sent) == [None] * 300
        routed = messages(3, groups=0, start=300, route=other)
        routed[2].route = "elsewhere-" + other
        results = sink.deliver(routed)
        assert results[:2] == [None, None] and "ResourceNotFound" in str(results[2])
    got = records(moto, stream)
    assert len(got) == 300
    by_key: dict[str, list[int]] = {}
    shards: dict[str, set[str]] = {}
    for r in got:
        by_key.setdefault(r["key"], []).append(json.loads(r["data"])["record"]["id"])
        shards.setdefault(r["key"], set()).add(r["shard"])
    assert by_key == {f"g{g}": list(range(g, 300, 9)) for g in range(9)}
    assert all(len(s) == 1 for s in shards.values()) and len(set().union(*shards.values())) == 2
    assert next(r["data"] for r in got if r["key"] == "g0") == sent[0].payload
    assert [r["key"] for r in records(moto, other)] == ["1300:300", "1301:301"]  # ungrouped: their own keys


def test_kinesis_limits_checked_before_sending_and_outage(moto: MotoServer) -> None:
    stream = make_stream(moto, 1)
    batch = messages(6, groups=2)
    big = json.loads(batch[2].payload)
    big["record"]["name"] = "x" * 1_100_000
    batch[2].payload = json.dumps(big).encode()  # group g0
    sink = sink_of(KinesisDestination(stream_name=stream, **moto.connection()))
    try:
        results = deliver_in_order(sink, batch)
        assert "too large" in str(results[2]) and "1048576" in str(results[2])
        assert results[4] == HELD and [results[i] for i in (0, 1, 3, 5)] == [None] * 4
        # 5 MiB a call: six 0.9 MiB records go in two requests, all acknowledged
        fat = messages(6, groups=6, start=10)
        for m in fat:
            m.payload = m.payload[:-1] + b',"pad":"' + b"y" * 900_000 + b'"}'
        assert sink.deliver(fat) == [None] * 6
        moto.stop()
        with pytest.raises(SinkUnavailable, match="did not answer"):
            sink.deliver(messages(3, start=20))
        moto.start()
        assert sink.deliver(messages(3, start=20)) == [None] * 3
    finally:
        sink.close()
    arn = moto.client("kinesis").describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    with sink_of(KinesisDestination(stream_arn=arn, **moto.connection())) as sink:  # Sequin's key
        assert sink.deliver(messages(2, start=30)) == [None] * 2
    assert len(records(moto, stream)) == 4 + 6 + 3 + 2
    with pytest.raises(SinkUnavailable, match="ResourceNotFound"):
        sink_of(KinesisDestination(stream_name="gone" + stream, **moto.connection())).open()
