"""Amazon Kinesis Data Streams sink on aiobotocore: PutRecords of up to 500 records, a result per record.

* Data = the message JSON; partition key = the message's group (a digest of it past 256 characters; an
  ungrouped message: its own key), so a group stays on one shard and a shard's order is the group's.
* Kinesis keeps order only within a call's successful prefix: a record that fails may have later records
  of the call stored. So a request holds at most one record per group, and a group's next record goes out
  only once the previous one was acknowledged (the scheduler's, delivery/schedule/).
* Limits checked before sending: a record (data and partition key) over 1 MiB is that message's failure
  (parked with the reason), its group held, other groups flow; a request stays within 500 records and
  5 MiB.
* A record failing with ProvisionedThroughputExceededException or InternalFailure is unanswered (retried
  later, not counted); a whole request refused by throttling, 5xx, credentials, a missing `stream_name`
  stream or no answer is an outage (sinks/aws/client.py).
* A route is the name of another stream: an invalid name, one outside `route_prefixes` or a stream that
  does not exist is that message's failure. Consumers dedupe on the idempotency key in the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from cdc_pipeline.sinks.aws.client import AwsClient, describe, entry_result, error_code
from cdc_pipeline.sinks.aws.names import partition_key, route_problem
from cdc_pipeline.sinks.base import OutboundMessage, SinkConfigLike
from cdc_pipeline.sinks.batch_plan import RequestLimits
from cdc_pipeline.sinks.batching import BatchingSink, DestinationDown, Encoded

MAX_RECORD_BYTES = 1_048_576  # 1 MiB: data and partition key
MAX_CALL_BYTES = 5 * 1_048_576
MAX_RECORDS = 500
_MISSING = {"ResourceNotFoundException"}


class KinesisSink(BatchingSink):
    kind = "kinesis"
    request_limits = RequestLimits(max_entries=MAX_RECORDS, max_request_bytes=MAX_CALL_BYTES, max_entry_bytes=MAX_RECORD_BYTES,
                    what="Kinesis record (data and partition key)")

    def __init__(self, sink_config: SinkConfigLike) -> None:
        dest = sink_config.destination
        super().__init__(sink_config.name)
        self.stream: str = dest.stream_arn or dest.stream_name  # an ARN or a name (see _stream)
        self.route_prefixes: list[str] | None = dest.route_prefixes
        self._client = AwsClient("kinesis", dest)

    async def connect(self) -> None:
        await self._client.open()
        try:
            await self._client.call("describe_stream_summary", **_stream(self.stream))
        except ClientError as exc:
            raise DestinationDown(f"stream {self.stream}: {describe(exc)}") from None

    async def disconnect(self) -> None:
        await self._client.close()

    def encode(self, message: OutboundMessage) -> Encoded | str:
        problem = route_problem("stream", message.route, self.route_prefixes)
        if problem:
            return problem
        key = partition_key(message.group, message.key)
        return Encoded(message.route or self.stream, {"Data": message.payload, "PartitionKey": key},
                       len(message.payload) + len(key.encode()))

    async def send_request(self, target: str, entries: Sequence[tuple[OutboundMessage, Any]]) -> list[str | None]:
        try:
            answer = await self._client.call("put_records", **_stream(target), Records=[e for _, e in entries])
        except ClientError as exc:
            if target == self.stream and error_code(exc) in _MISSING:
                raise DestinationDown(f"stream {self.stream}: {describe(exc)}") from None
            return [describe(exc)] * len(entries)
        records = answer.get("Records", [])
        if len(records) != len(entries):
            return ["Kinesis returned results for another number of records"] * len(entries)
        return [entry_result(r["ErrorCode"], r.get("ErrorMessage", "")) if r.get("ErrorCode") else None
                for r in records]


def _stream(name_or_arn: str) -> dict[str, str]:
    return {"StreamARN": name_or_arn} if name_or_arn.startswith("arn:") else {"StreamName": name_or_arn}
