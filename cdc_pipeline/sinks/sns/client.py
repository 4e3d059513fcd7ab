"""Amazon SNS sink on aiobotocore: PublishBatch of up to 10 messages, a result per entry.

* Message = the message JSON; message attributes `idempotency_key`, `table` (schema.table) and `action`
  (the last two when the message has them), so subscriptions can filter on them.
* FIFO topic (name ending `.fifo`): MessageGroupId = the message's group (an ungrouped message: its own
  key), MessageDeduplicationId = its idempotency key: a redelivery within the 5-minute window is dropped.
  A standard topic keeps no order.
* Sizes are checked before sending (256 KiB, message and attributes); a rejected entry fails alone; an
  entry SNS could not take for its own reasons and a whole request refused by throttling, 5xx,
  credentials, a missing `topic_arn` topic or no answer are an outage (sinks/aws/client.py), as for SQS.
* A route is the name of another topic of the same account and region as `topic_arn`: an invalid name,
  one outside `route_prefixes` or a topic that does not exist is that message's failure.
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

_MISSING = {"NotFound", "NotFoundException"}


class SnsSink(BatchingSink):
    kind = "sns"
    request_limits = RequestLimits(max_entries=10, max_request_bytes=MAX_MESSAGE_BYTES, max_entry_bytes=MAX_MESSAGE_BYTES,
                    what="SNS message (body and attributes)")

    def __init__(self, sink_config: SinkConfigLike) -> None:
        dest = sink_config.destination
        super().__init__(sink_config.name)
        self.topic_arn: str = dest.topic_arn
        self._arn_prefix = self.topic_arn.rsplit(":", 1)[0] + ":"
        self.route_prefixes: list[str] | None = dest.route_prefixes
        self._client = AwsClient("sns", dest)

    @classmethod
    def config_findings(cls, sink_config: SinkConfigLike) -> list[str]:
        if sink_config.destination.topic_arn.endswith(".fifo"):
            return []
        return ["the topic is a standard one (its name does not end in .fifo): consumers may see a group's messages "
                "out of commit order, and a redelivered message twice"]

    async def connect(self) -> None:
        await self._client.open()
        try:
            await self._client.call("get_topic_attributes", TopicArn=self.topic_arn)
        except ClientError as exc:
            raise DestinationDown(f"topic {self.topic_arn}: {describe(exc)}") from None

    async def disconnect(self) -> None:
        await self._client.close()

    def encode(self, message: OutboundMessage) -> Encoded | str:
        problem = route_problem("topic", message.route, self.route_prefixes)
        if problem:
            return problem
        arn = self._arn_prefix + message.route if message.route else self.topic_arn
        entry, size = batch_entry("Message", message, arn.endswith(".fifo"))
        return Encoded(arn, entry, size)

    async def send_request(self, target: str, entries: Sequence[tuple[OutboundMessage, Any]]) -> list[str | None]:
        try:
            answer = await self._client.call("publish_batch", TopicArn=target, PublishBatchRequestEntries=numbered(entries))
        except ClientError as exc:
            if target == self.topic_arn and error_code(exc) in _MISSING:
                raise DestinationDown(f"topic {self.topic_arn}: {describe(exc)}") from None
            return [describe(exc)] * len(entries)
        return batch_results("SNS", answer, len(entries))
