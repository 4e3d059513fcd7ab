"""The state side of a delivery, by class: what keeps the offset, parks messages, holds the lane and does the
housekeeping between windows. A deliverer builds one of each; a dry run swaps in parts that record nothing
(dry_run.py)."""

from __future__ import annotations

from dataclasses import dataclass

from cdc_pipeline.delivery.housekeeping import Housekeeping
from cdc_pipeline.delivery.lane_keeper import LaneKeeper
from cdc_pipeline.delivery.offset import OffsetKeeper
from cdc_pipeline.delivery.parking import ParkingLot


@dataclass(frozen=True)
class Parts:
    offsets: type[OffsetKeeper] = OffsetKeeper
    parking: type[ParkingLot] = ParkingLot
    lane: type[LaneKeeper] = LaneKeeper
    housekeeping: type[Housekeeping] = Housekeeping


RECORDING = Parts()  # a real delivery's: every part records in the state database
