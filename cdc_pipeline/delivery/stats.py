"""What a delivery run did, for the CLI, logs and Dagster metadata."""

from __future__ import annotations

from dataclasses import dataclass

from cdc_pipeline.core.positions import Position


@dataclass
class DeliveryStats:
    sink: str
    batches: int = 0
    read: int = 0
    delivered: int = 0
    filtered: int = 0
    parked: int = 0
    retried: int = 0
    discarded: int = 0
    seconds: float = 0.0
    offset: Position = (0, -1)
    lag_messages: int = 0
    outage_retries: int = 0  # times the run waited for the destination or the state database
    waiting: str | None = None  # why the run was still waiting when it ended

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds else 0.0

    def as_metadata(self) -> dict[str, float | int | str]:
        return {
            "messages_delivered": self.delivered, "messages_parked": self.parked,
            "messages_discarded": self.discarded, "messages_filtered": self.filtered,
            "messages_retried": self.retried, "batches": self.batches,
            "rows_read": self.read,  # log rows read: a lane's share when the database selects it
            "throughput_msgs_per_s": round(self.rate, 1), "lag_messages": self.lag_messages,
            "offset": f"{self.offset[0]}:{self.offset[1]}", "outage_retries": self.outage_retries,
            **({"waiting_for_destination": self.waiting} if self.waiting else {}),
        }
