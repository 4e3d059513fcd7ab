"""Kafka faults the broker in the tests (Tansu) cannot produce, injected around the real producer and broker:
a record the broker rejects while its key's next record could be in flight (order per key kept: the next is
not produced until the rejection is known), and a producer in librdkafka's fatal state (an outage of the
sink: nothing counted against max_retries, nothing discarded, a new producer)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.sinks.kafka import client
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import drain, wait_until
from cdc_pipeline_tests.integration.sinks.test_kafka_pipeline import kafka_config
from cdc_pipeline_tests.integration.sinks.test_sink_kafka import kafka_sink
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages, unique
from cdc_pipeline_tests.kafka_broker import TansuBroker, broker

MARK = b'"id":1,'  # the record the "broker" rejects


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[TansuBroker]:
    yield from broker(tmp_path)


class RejectingProducer:
    """The real producer, but the broker 'rejects' a marked record (MESSAGE_TOO_LARGE) and reports it only
    once everything produced so far was acknowledged: the later a rejection, the likelier a reorder."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self._real = Producer(conf)
        self._rejected: list[Callable[[KafkaError, None], None]] = []

    def produce(self, topic: str, value: bytes, on_delivery: Callable[..., None], **kw: Any) -> None:
        if MARK in value:
            self._rejected.append(on_delivery)
            return
        self._real.produce(topic, value=value, on_delivery=on_delivery, **kw)

    def flush(self, timeout: float = -1) -> int:
        left = self._real.flush(timeout)
        if left == 0:
            while self._rejected:
                self._rejected.pop(0)(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "rejected by the broker"), None)
        return left

    def poll(self, timeout: float = -1) -> int:
        return self._real.poll(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_rejected_record_never_lets_its_keys_next_be_stored_first(kafka: TansuBroker,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "Producer", RejectingProducer)
    topic = unique("reject")
    kafka.create_topic(topic, partitions=2)
    batch = messages(12, groups=3)  # g1: ids 1 (rejected), 4, 7, 10
    with kafka_sink(kafka.bootstrap, topic) as sink:
        results = deliver_in_order(sink, batch)  # the scheduler's calls: one message per group each
    assert "MSG_SIZE_TOO_LARGE" in str(results[1])
    assert [results[i] for i in (4, 7, 10)] == [HELD] * 3  # held back, never produced behind it
    assert all(results[i] is None for i in range(12) if i % 3 != 1)
    stored = kafka.records(topic, 8)
    assert sorted(json.loads(r["value"])["record"]["id"] for r in stored) == [0, 2, 3, 5, 6, 8, 9, 11]


class FatalProducer:
    """The real producer until its Nth produce: then it is fenced for good (KafkaException with _FATAL), as
    librdkafka's idempotent producer is after an unrecoverable sequence gap. Later producers are healthy."""

    built: list[FatalProducer] = []
    fatal_at = 1

    def __init__(self, conf: dict[str, Any]) -> None:
        self._real = Producer(conf)
        self.produced = 0
        self.first = not FatalProducer.built
        FatalProducer.built.append(self)

    def produce(self, *args: Any, **kw: Any) -> None:
        self.produced += 1
        if self.first and self.produced >= FatalProducer.fatal_at:
            raise KafkaException(KafkaError(KafkaError._FATAL, "test: producer fenced", fatal=True))
        self._real.produce(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.mark.parametrize("fatal_at", [1, 6])  # the call's first record, or one after some were stored
def test_a_fatal_producer_is_an_outage_nothing_counted_and_a_new_producer(
        fatal_at: int, source_db: Database, write_config: Callable[..., PipelineConfig], kafka: TansuBroker,
        spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    FatalProducer.built, FatalProducer.fatal_at = [], fatal_at
    monkeypatch.setattr(client, "Producer", FatalProducer)
    topic = unique("fatal")
    kafka.create_topic(topic, partitions=2)
    config = kafka_config(source_db, write_config, kafka.bootstrap, topic)
    data = config.model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["delivery"] = {**data.get("delivery", {}), "retry_initial_ms": 50, "retry_max_ms": 100}
    data["sinks"][0].update(max_retries=0, backoff={"initial_ms": 50, "max_ms": 100, "jitter": 0})
    config = write_config(data)
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
    for _ in range(3):
        source_db.execute("UPDATE acct SET ver = ver + 1")
    drain(config)

    deliverer = Deliverer(config, config.sink("kafka"), spark)  # one sink, long-running: rides outages
    runs: list[DeliveryStats] = []
    thread = threading.Thread(target=lambda: runs.append(deliverer.run(until_idle=False, seconds=300)))
    thread.start()
    try:
        wait_until(lambda: len(kafka.records(topic)) >= 40 or not thread.is_alive(), timeout=120,
                   what="every change on the broker")
    finally:
        deliverer.stop()
        thread.join(60)
    assert runs, "the deliverer failed"
    assert runs[0].discarded == 0 and runs[0].delivered >= 40, runs[0]
    assert len(FatalProducer.built) == 2  # the dead producer was replaced once, in the same sink
    with psycopg.connect(config.state_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.failed_messages").fetchone() == (0,)
    versions: dict[bytes, list[int]] = {}
    for r in sorted(kafka.records(topic), key=lambda r: (r["partition"], r["offset"])):
        versions.setdefault(r["key"], []).append(json.loads(r["value"])["record"]["ver"])
    assert len(versions) == 10
    for seen in versions.values():  # in order per key; a redelivery may repeat, never go back
        assert seen == sorted(seen) and set(seen) == {0, 1, 2, 3}


