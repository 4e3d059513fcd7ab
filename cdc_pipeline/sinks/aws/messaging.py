"""What the SQS and SNS sinks share: a message as a batch entry (its body, attributes and FIFO ids, and its
size as both services count it) and a batch's answer read as a result per entry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdc_pipeline.sinks.aws.client import entry_result
from cdc_pipeline.sinks.aws.names import dedup_id, fifo_group_id
from cdc_pipeline.sinks.base import OutboundMessage
from cdc_pipeline.sinks.kafka.topics import headers

MAX_MESSAGE_BYTES = 262_144  # 256 KiB, a message and a whole batch


def attributes(message: OutboundMessage) -> tuple[dict[str, dict[str, str]], int]:
    """The message attributes (String) and their size as SQS and SNS count it (name, type and value)."""
    out: dict[str, dict[str, str]] = {}
    size = 0
    for name, value in headers(message.key, message.payload):
        text = value.decode()
        if text:  # an attribute value may not be empty
            out[name] = {"DataType": "String", "StringValue": text}
            size += len(name.encode()) + len(b"String") + len(value)
    return out, size


def batch_entry(body_field: str, message: OutboundMessage, fifo: bool) -> tuple[dict[str, Any], int]:
    """The entry of `message` (its JSON under `body_field`) and its counted size; on a FIFO queue or topic
    its group orders it and its idempotency key deduplicates a redelivery."""
    attrs, attrs_size = attributes(message)
    entry: dict[str, Any] = {body_field: message.payload.decode(), "MessageAttributes": attrs}
    if fifo:
        entry["MessageGroupId"] = fifo_group_id(message.group, message.key)
        entry["MessageDeduplicationId"] = dedup_id(message.key)
    return entry, len(message.payload) + attrs_size


def numbered(entries: Sequence[tuple[OutboundMessage, Any]]) -> list[dict[str, Any]]:
    """The entries of a batch request, each with its position as its `Id`."""
    return [{"Id": str(n), **entry} for n, (_, entry) in enumerate(entries)]


def batch_results(service: str, answer: dict[str, Any], count: int) -> list[str | None]:
    """A result per entry of a batch answer (`Successful` / `Failed`, by `Id`); an entry the answer does not
    name failed."""
    results: list[str | None] = [f"{service} returned no result for this entry"] * count
    for ok in answer.get("Successful", []):
        results[int(ok["Id"])] = None
    for bad in answer.get("Failed", []):
        results[int(bad["Id"])] = entry_result(bad.get("Code", "error"), bad.get("Message", ""),
                                               bool(bad.get("SenderFault", True)))
    return results
