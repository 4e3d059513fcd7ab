"""The sqs sink against moto's real AWS-protocol server, read back with a plain boto3 client: FIFO order per
group and deduplication of redeliveries, attributes, routes, a too-large message parked while its group
waits, a standard queue, an outage (server stopped) and secrets kept out of messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import SinkUnavailable, Unreachable
from cdc_pipeline.sinks.sqs import SqsDestination
from cdc_pipeline.sinks.sqs.client import SqsSink
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages
from cdc_pipeline_tests.scheduled import scheduled
from cdc_pipeline_tests.servers import MotoServer, moto_server, unique


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    yield from moto_server()


def make_queue(moto: MotoServer, fifo: bool = True, name: str | None = None) -> str:
    name = name or unique("q") + (".fifo" if fifo else "")
    attrs = {"FifoQueue": "true"} if fifo else {}
    return str(moto.client("sqs").create_queue(QueueName=name, Attributes=attrs)["QueueUrl"])


def sqs_sink(moto: MotoServer, queue_url: str, **kw: Any) -> Any:
    """The sink as the engine's calls use it (cdc_pipeline_tests/scheduled.py)."""
    dest = SqsDestination(queue_url=queue_url, **moto.connection(), **kw)
    sink = build_sink(SimpleNamespace(name=unique("sqs"), destination=dest), {})
    assert isinstance(sink, SqsSink)
    return scheduled(sink, dest)


def received(moto: MotoServer, queue_url: str, at_least: int = 0, rounds: int = 200) -> list[dict[str, Any]]:
    """Every message of the queue, in the order SQS hands them out, deleting each batch once read (a FIFO
    group's next message comes only after the previous one is deleted)."""
    client = moto.client("sqs")
    out: list[dict[str, Any]] = []
    empty = 0
    for _ in range(rounds):
        got = client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, AttributeNames=["All"],
                                     MessageAttributeNames=["All"], WaitTimeSeconds=0).get("Messages", [])
        if not got:
            empty += 1
            if len(out) >= at_least and empty >= 2:
                return out
            continue
        empty = 0
        out += got
        client.delete_message_batch(QueueUrl=queue_url, Entries=[
            {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)])
    raise AssertionError(f"{len(out)} messages read, expected at least {at_least}")


def ids_by_group(msgs: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for m in msgs:
        out.setdefault(m["Attributes"]["MessageGroupId"], []).append(json.loads(m["Body"])["record"]["id"])
    return out


def test_fifo_keeps_each_groups_order_with_attributes_and_drops_redeliveries(moto: MotoServer) -> None:
    url = make_queue(moto)
    sent = messages(60, groups=7)
    with sqs_sink(moto, url) as sink:
        assert sink.deliver(sent) == [None] * 60
        assert sink.deliver(sent[20:40]) == [None] * 20  # a redelivery: same idempotency keys
    got = received(moto, url, 60)
    assert len(got) == 60  # the queue dropped the redelivered ones (deduplication id = idempotency key)
    assert ids_by_group(got) == {f"g{g}": list(range(g, 60, 7)) for g in range(7)}
    first = next(m for m in got if json.loads(m["Body"])["record"]["id"] == 0)
    assert first["Body"].encode() == sent[0].payload  # the message JSON, byte for byte
    assert first["Attributes"]["MessageDeduplicationId"] == "1000:0"
    assert {k: v["StringValue"] for k, v in first["MessageAttributes"].items()} == {
        "idempotency_key": "1000:0", "table": "public.orders", "action": "insert"}


def test_too_large_message_is_parked_with_a_clear_error_while_its_group_waits(moto: MotoServer) -> None:
    url = make_queue(moto)
    batch = messages(12, groups=3)
    big = json.loads(batch[4].payload)
    big["record"]["name"] = "x" * 300_000
    batch[4].payload = json.dumps(big).encode()  # group g1
    with sqs_sink(moto, url) as sink:
        results = deliver_in_order(sink, batch)
    assert "too large" in str(results[4]) and "262144" in str(results[4])
    assert not isinstance(results[4], Unreachable)  # its own failure: counted, parked
    assert [i for i, r in enumerate(results) if r == HELD] == [7, 10]  # g1's later messages wait behind it
    assert ids_by_group(received(moto, url, 9)) == {"g0": [0, 3, 6, 9], "g1": [1], "g2": [2, 5, 8, 11]}


def test_standard_queue_and_routes(moto: MotoServer) -> None:
    url, other = make_queue(moto, fifo=False), unique("cdc-routed-")
    make_queue(moto, fifo=False, name=other)
    batch = messages(8, groups=0)
    batch[5].route = other
    batch[6].route = "not a queue!"
    batch[7].route = unique("cdc-missing-")
    with sqs_sink(moto, url, route_prefixes=["cdc-"]) as sink:
        results = sink.deliver(batch)
    assert results[:6] == [None] * 6
    assert "invalid queue name" in str(results[6]) and "QueueDoesNotExist" in str(results[7]) or \
        "NonExistentQueue" in str(results[7])
    got = received(moto, url, 5)
    assert sorted(json.loads(m["Body"])["record"]["id"] for m in got) == [0, 1, 2, 3, 4]
    assert "MessageGroupId" not in got[0]["Attributes"]  # a standard queue: no group, no order
    routed = moto.client("sqs").get_queue_url(QueueName=other)["QueueUrl"]
    assert [json.loads(m["Body"])["record"]["id"] for m in received(moto, routed, 1)] == [5]
    with sqs_sink(moto, url, route_prefixes=["cdc-"]) as sink:
        batch = messages(1, groups=0)
        batch[0].route = "elsewhere"
        assert "route_prefixes" in str(sink.deliver(batch)[0])


def test_outage_server_stopped_is_waited_for_and_delivery_resumes(moto: MotoServer) -> None:
    url = make_queue(moto)
    sink = sqs_sink(moto, url)
    try:
        assert sink.deliver(messages(10)) == [None] * 10
        moto.stop()
        with pytest.raises(SinkUnavailable, match="did not answer"):
            sink.deliver(messages(10, start=10))
        moto.start()  # back, holding its queues (moto keeps them in this process)
        assert sink.deliver(messages(10, start=10)) == [None] * 10
    finally:
        sink.close()
    assert len(received(moto, url, 20)) == 20


def test_missing_queue_is_an_outage_not_a_message_failure(moto: MotoServer) -> None:
    url = make_queue(moto)
    with pytest.raises(SinkUnavailable, match="does not exist"):
        sqs_sink(moto, url + "-gone.fifo").open()
    with sqs_sink(moto, url) as sink:
        moto.client("sqs").delete_queue(QueueUrl=url)
        with pytest.raises(SinkUnavailable, match="does not exist"):
            sink.deliver(messages(3))


def test_secrets_never_shown() -> None:
    dest = SqsDestination(queue_url="http://127.0.0.1:1/1/q.fifo", endpoint_url="http://127.0.0.1:1",
                          access_key_id="AKIDEXAMPLE",
                          secret_access_key="wJalrXUtnFEMI-very-secret", session_token="tok-very-secret")
    assert "very-secret" not in repr(dest) and "very-secret" not in str(dest.model_dump())
    with pytest.raises(ValidationError, match="go together"):
        SqsDestination(queue_url="http://h/1/q", access_key_id="AKIDEXAMPLE")
    sink = build_sink(SimpleNamespace(name="s", destination=dest), {})
    with pytest.raises(SinkUnavailable) as down:
        sink.open()
    assert "very-secret" not in str(down.value) and "127.0.0.1:1" in str(down.value)
    sink.close()


def test_check_reports_a_missing_queue_and_a_standard_one(moto: MotoServer) -> None:
    def findings(url: str) -> list[tuple[str, str]]:
        config = SimpleNamespace(name="q", destination=SqsDestination(queue_url=url, **moto.connection()))
        return [(f.level, f.message) for f in SqsSink.check_findings(config)]

    assert findings(make_queue(moto)) == []
    assert [level for level, _ in findings(make_queue(moto, fifo=False))] == ["warning"]
    (level, message), = findings(make_queue(moto) + "-gone.fifo")
    assert level == "error" and "does not exist" in message
