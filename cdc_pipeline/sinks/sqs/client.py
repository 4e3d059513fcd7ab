"""Amazon SQS sink on aiobotocore: SendMessageBatch of up to 10 messages, a result per entry.

* Body = the message JSON; message attributes `idempotency_key`, `table` (schema.table) and `action` (the
  last two when the message has them).
* FIFO queue (name ending `.fifo`): MessageGroupId = the message's group (an ungrouped message: its own
  key), MessageDeduplicationId = its idempotency key, so a redelivery after a crash or an outage is
  dropped by the queue within its 5-minute deduplication window. A standard queue keeps no order: its
  consumers see messages in any order, and possibly twice.
* Sizes are checked before sending: a message over 256 KiB (body and attributes, as SQS counts them) is
  that message's failure (parked with the reason), its group held, other groups flow.
* A rejected entry fails alone (parked); an entry SQS could not take for its own reasons (not the
  sender's fault) and a whole request refused by throttling, 5xx, credentials, a missing `queue_url`
  queue or no answer are an outage (sinks/aws/client.py).
* A route is the name of another queue of the same account and region (resolved once with GetQueueUrl):
  an invalid name, one outside `route_prefixes` or a queue that does not exist is that message's failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from cdc_pipeline.sinks.aws.client import AwsClient, describe, error_code
from cdc_pipeline.sinks.aws.messaging import MAX_MESSAGE_BYTES, batch_entry, batch_results, numbered
from cdc_pipeline.sinks.aws.names import route_problem
from cdc_pipeline.sinks.base import OutboundMessage, SinkConfigLike
from cdc_pipeline.sinks.batch_plan import RequestLimits
from cdc_pipeline.sinks.batching import BatchingSink, DestinationDown, Encoded

_MISSING = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}


class SqsSink(BatchingSink):
    kind = "sqs"
    request_limits = RequestLimits(max_entries=10, max_request_bytes=MAX_MESSAGE_BYTES, max_entry_bytes=MAX_MESSAGE_BYTES,
                    what="SQS message (body and attributes)")

    def __init__(self, sink_config: SinkConfigLike) -> None:
        dest = sink_config.destination
        super().__init__(sink_config.name)
        self.queue_url: str = dest.queue_url
        self.route_prefixes: list[str] | None = dest.route_prefixes
        self._client = AwsClient("sqs", dest)
        self._urls: dict[str, str] = {}  # route (queue name) -> queue URL

    @classmethod
    def config_findings(cls, sink_config: SinkConfigLike) -> list[str]:
        if sink_config.destination.queue_url.endswith(".fifo"):
            return []
        return ["the queue is a standard one (its name does not end in .fifo): consumers may see a group's messages "
                "out of commit order, and a redelivered message twice"]

    async def connect(self) -> None:
        await self._client.open()
        try:
            await self._client.call("get_queue_attributes", QueueUrl=self.queue_url, AttributeNames=["FifoQueue"])
        except ClientError as exc:
            raise DestinationDown(f"queue {self.queue_url}: {describe(exc)}") from None

    async def disconnect(self) -> None:
        await self._client.close()

    def encode(self, message: OutboundMessage) -> Encoded | str:
        problem = route_problem("queue", message.route, self.route_prefixes)
        if problem:
            return problem
        entry, size = batch_entry("MessageBody", message, (message.route or self.queue_url).endswith(".fifo"))
        return Encoded(message.route or "", entry, size)

    async def send_request(self, target: str, entries: Sequence[tuple[OutboundMessage, Any]]) -> list[str | None]:
        try:
            url = await self._url(target)
            answer = await self._client.call("send_message_batch", QueueUrl=url, Entries=numbered(entries))
        except ClientError as exc:
            if not target and error_code(exc) in _MISSING:
                raise DestinationDown(f"queue {self.queue_url}: {describe(exc)}") from None
            return [describe(exc)] * len(entries)
        return batch_results("SQS", answer, len(entries))

    async def _url(self, route: str) -> str:
        if not route:
            return self.queue_url
        if route not in self._urls:
            self._urls[route] = (await self._client.call("get_queue_url", QueueName=route))["QueueUrl"]
        return self._urls[route]
