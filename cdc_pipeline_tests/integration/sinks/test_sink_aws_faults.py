"""Faults moto does not produce, from a real HTTP server speaking the AWS JSON protocol: throttling, a 5xx,
refused credentials (an outage: SinkUnavailable, nothing counted), and per-entry results of a batch, where
an entry the service could not take for its own reasons is unanswered (`Unreachable`) and one it rejected
is that message's own failure."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import Sink, SinkUnavailable, Unreachable
from cdc_pipeline.sinks.kinesis import KinesisDestination
from cdc_pipeline.sinks.sqs import SqsDestination
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages
from cdc_pipeline_tests.scheduled import scheduled

SECRET = "aws-secret-never-shown"


class ScriptedAws:
    """Answers each operation (X-Amz-Target's last part) with its scripted (status, body), the last one
    repeated; records the operations it was asked."""

    def __init__(self) -> None:
        self.script: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.asked: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                op = str(self.headers.get("X-Amz-Target", "")).rpartition(".")[2]
                owner.asked.append(op)
                answers = owner.script.get(op) or [(200, {})]
                status, body = answers.pop(0) if len(answers) > 1 else answers[0]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def aws() -> Iterator[ScriptedAws]:
    server = ScriptedAws()
    yield server
    server.close()


def sqs(aws: ScriptedAws) -> Sink:
    dest = SqsDestination(queue_url=f"{aws.url}/1/q.fifo", endpoint_url=aws.url, access_key_id="AKID",
                          secret_access_key=SECRET)
    return scheduled(build_sink(SimpleNamespace(name="faults", destination=dest), {}))


def error(code: str, message: str = "no") -> dict[str, str]:
    return {"__type": f"com.amazonaws.sqs#{code}", "message": message}


@pytest.mark.parametrize(("status", "code"), [(503, "ServiceUnavailable"), (500, "InternalError"),
                                              (400, "ThrottlingException"), (403, "AccessDenied"),
                                              (400, "InvalidClientTokenId")])
def test_a_whole_request_refused_for_the_service_is_an_outage(aws: ScriptedAws, status: int, code: str) -> None:
    aws.script["SendMessageBatch"] = [(status, error(code))]
    with sqs(aws) as sink, pytest.raises(SinkUnavailable, match=code) as down:
        sink.deliver(messages(4))
    assert SECRET not in str(down.value)
    assert aws.asked.count("SendMessageBatch") >= 1


def test_a_request_refused_for_its_messages_fails_them(aws: ScriptedAws) -> None:
    aws.script["SendMessageBatch"] = [(400, error("InvalidParameterValue", "bad attribute"))]
    with sqs(aws) as sink:
        results = sink.deliver(messages(2, groups=2))
    assert all("InvalidParameterValue: bad attribute" in str(r) and not isinstance(r, Unreachable) for r in results)


def test_per_entry_results_are_per_message_outcomes(aws: ScriptedAws) -> None:
    aws.script["SendMessageBatch"] = [(200, {
        "Successful": [{"Id": "0", "MessageId": "m0"}, {"Id": "3", "MessageId": "m3"}],
        "Failed": [{"Id": "1", "Code": "InternalError", "Message": "try later", "SenderFault": False},
                   {"Id": "2", "Code": "InvalidMessageContents", "Message": "bad char", "SenderFault": True}]})]
    with sqs(aws) as sink:
        results = sink.deliver(messages(4, groups=4))
    assert results[0] is None and results[3] is None
    assert isinstance(results[1], Unreachable) and "InternalError" in results[1]  # the service's fault: retried
    assert results[2] == "InvalidMessageContents: bad char"  # the message's own: parked, counted


def test_kinesis_throttled_records_are_unanswered_and_the_others_acknowledged(aws: ScriptedAws) -> None:
    aws.script["PutRecords"] = [(200, {"FailedRecordCount": 2, "Records": [
        {"SequenceNumber": "1", "ShardId": "shardId-0"},
        {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "rate exceeded"},
        {"ErrorCode": "InternalFailure", "ErrorMessage": "oops"}]})]
    dest = KinesisDestination(stream_name="s", endpoint_url=aws.url, access_key_id="AKID", secret_access_key=SECRET)
    with scheduled(build_sink(SimpleNamespace(name="k", destination=dest), {})) as sink:
        results = sink.deliver(messages(3, groups=3))
        assert results[0] is None and all(isinstance(r, Unreachable) for r in results[1:])
        aws.script["PutRecords"] = [(400, {"__type": "ProvisionedThroughputExceededException", "message": "slow"})]
        with pytest.raises(SinkUnavailable, match="ProvisionedThroughputExceeded"):
            sink.deliver(messages(2, start=5))
