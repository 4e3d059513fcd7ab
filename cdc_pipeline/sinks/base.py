"""The one interface every sink implements."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class OutboundMessage:
    key: str  # idempotency key, stable across redeliveries
    group: str | None  # ordering group (None = ungrouped)
    route: str | None  # per-message destination override; None = the destination's default
    payload: bytes  # compact UTF-8 JSON: {"record", "changes", "action", "metadata"}


class SinkUnavailable(Exception):
    """The whole destination is unreachable: transient; the batch is retried and the offset stays."""


class Sink(abc.ABC):
    name: str

    def open(self) -> None:
        """Connect; called once per delivery run."""

    @abc.abstractmethod
    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        """One result per message: None = acknowledged, str = why it failed. Messages of one group are
        attempted in order, and after a failure the group's later messages in the batch are not attempted."""

    def close(self) -> None:
        """Release connections."""

    def prepare(self, describe: Callable[[str], Any]) -> None:
        """Receive a lookup of source table shapes ('schema.table' -> TableInfo); for sinks that need it."""

    def position(self) -> tuple[int, int] | None:
        """The last position the destination itself committed, for sinks that commit it atomically."""
        return None

    def __enter__(self) -> Sink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
