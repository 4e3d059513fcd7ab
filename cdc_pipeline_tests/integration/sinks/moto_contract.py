"""The contract suite's sqs, sns and kinesis sink types (conftest.py's `sqs_sink`, `sns_sink`, `kinesis_sink`):
each on moto's AWS-protocol server, started for the test on a free port (cdc_pipeline_tests/servers.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from cdc_pipeline_tests.integration.sinks.contract import POISON, Got, SinkUnderTest, parse
from cdc_pipeline_tests.servers import unique

CLOSED_PORT = 1  # nothing listens on port 1


def _poison_route(target: str) -> Callable[[dict[str, Any]], None]:
    """Row POISON's messages routed to `target`, which does not exist: refused, that message's own failure."""
    def poison(entry: dict[str, Any]) -> None:
        entry["route"] = f"CASE WHEN record.id = {POISON} THEN '{target}' END"

    return poison


class _Moto:
    """moto's server for one test, and the FIFO queue reading of the sqs and sns sink types."""

    def __init__(self) -> None:
        from cdc_pipeline_tests.servers import MotoServer

        self.server = MotoServer()
        self.server.start()
        self.sqs = self.server.client("sqs")
        self.got: list[Got] = []  # taken off the queue so far (a read deletes: a FIFO group's next comes then)

    def queue(self, name: str) -> str:
        return str(self.sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"])

    def read(self, url: str) -> list[Got]:
        while batch := self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"],
                                                MessageAttributeNames=["All"]).get("Messages", []):
            self.got.extend(Got(parse(m["Body"]), m["Attributes"].get("MessageDeduplicationId"),
                                {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()})
                            for m in batch)
            self.sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(batch)])
        return list(self.got)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        self.server.stop()  # moto keeps its data in this process: back with what it held
        try:
            yield
        finally:
            self.server.start()

    def fifo_topic(self) -> tuple[str, str]:
        """A FIFO topic and the FIFO queue subscribed to it with raw delivery (the body is the message)."""
        name = unique("cdc-contract-")
        sns = self.server.client("sns")
        arn = str(sns.create_topic(Name=f"{name}.fifo", Attributes={"FifoTopic": "true"})["TopicArn"])
        url = self.queue(f"{name}-sub.fifo")
        queue_arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
        return arn, url


def _attributes(m: dict[str, Any]) -> dict[str, str]:
    """The SQS and SNS message attributes of a message."""
    return {"idempotency_key": m["metadata"]["idempotency_key"], "action": m["action"], "table": "public.t"}


def moto_contract(kind: str) -> Iterator[SinkUnderTest]:
    moto = _Moto()
    attributes: Callable[[dict[str, Any]], dict[str, str]] = _attributes
    if kind == "sqs":
        url = moto.queue(unique("cdc-contract-") + ".fifo")
        destination: dict[str, Any] = {"type": "sqs", "queue_url": url}
    elif kind == "sns":
        arn, url = moto.fifo_topic()
        destination = {"type": "sns", "topic_arn": arn}
    else:
        from cdc_pipeline_tests.integration.sinks.test_sink_sns_kinesis import make_stream, records

        stream = make_stream(moto.server, 2)
        destination = {"type": "kinesis", "stream_name": stream}
        attributes = lambda m: {}  # noqa: E731 - records carry no attributes
    received: Callable[[], list[Got]] = (
        (lambda: [Got(parse(r["data"])) for r in records(moto.server, stream)]) if kind == "kinesis"
        else (lambda: moto.read(url)))
    try:
        yield SinkUnderTest(
            destination=lambda: {**destination, **moto.server.connection()}, received=received,
            poison=_poison_route(unique("cdc-missing-") + ("" if kind == "kinesis" else ".fifo")),  # none such
            outage=moto.outage, headers=attributes,
            unreachable=lambda: {**destination, "endpoint_url": f"http://127.0.0.1:{CLOSED_PORT}",
                                 "access_key_id": "AKIDCONTRACT", "secret_access_key": "aws-s3cret"},
            secret="aws-s3cret")
    finally:
        moto.server.stop()
