"""A streaming run hands over to a fresh run when a check of its was executed by hand (defs/handover.py):
it asks its sensor for a successor only for a record of a run that does not stream, and ends its work once
the successor waits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dagster import AssetCheckKey, AssetKey

from cdc_pipeline.defs.handover import Handover
from cdc_pipeline.defs.tags import AFTER_TAG, HANDOVER_TAG, KIND_TAG, SENSOR_NAME_TAG

CHECK = AssetCheckKey(AssetKey(["sink", "s"]), "lag_below_max")


class Instance:
    def __init__(self) -> None:
        self.latest: dict[AssetCheckKey, Any] = {}
        self.runs: dict[str, Any] = {}
        self.tags: dict[str, str] = {}
        self.waiting: list[Any] = []
        self.event_log_storage = self

    def get_latest_asset_check_execution_by_key(self, keys: list[AssetCheckKey]) -> dict[AssetCheckKey, Any]:
        return {k: v for k, v in self.latest.items() if k in keys}

    def get_run_by_id(self, run_id: str) -> Any:
        return self.runs.get(run_id)

    def add_run_tags(self, run_id: str, tags: dict[str, str]) -> None:
        assert run_id == "stream"
        self.tags.update(tags)

    def get_run_records(self, filters: Any, limit: int) -> list[Any]:
        assert filters.tags == {AFTER_TAG: "stream"}
        return self.waiting


def _handover(sensor: bool = True) -> tuple[Handover, Instance, list[str]]:
    instance, stopped = Instance(), []
    context = SimpleNamespace(run_id="stream", instance=instance, log=SimpleNamespace(info=lambda _: None),
                              run=SimpleNamespace(tags={SENSOR_NAME_TAG: "cdc_delivery_sensor"} if sensor else {}))
    return Handover(context, [CHECK], lambda: {"lag_below_max"}, lambda: stopped.append("stop")), instance, stopped


def test_a_check_executed_by_hand_hands_the_stream_over_to_a_fresh_run() -> None:
    handover, instance, stopped = _handover()
    instance.latest[CHECK] = SimpleNamespace(run_id="stream")
    handover.poll()
    assert not instance.tags  # its own record is the latest
    instance.latest[CHECK] = SimpleNamespace(run_id="by-hand")
    instance.runs["by-hand"] = SimpleNamespace(tags={})
    handover.poll()
    assert "by-hand" in instance.tags[HANDOVER_TAG] and not stopped  # asked; no successor waits yet
    instance.waiting = [SimpleNamespace(dagster_run=SimpleNamespace(run_id="next"))]
    handover.poll()
    handover.poll()
    assert stopped == ["stop"]


def test_another_streaming_run_or_a_run_without_a_sensor_is_no_reason() -> None:
    handover, instance, stopped = _handover()
    instance.latest[CHECK] = SimpleNamespace(run_id="lane1")  # another lane of the same sink
    instance.runs["lane1"] = SimpleNamespace(tags={KIND_TAG: "delivery"})
    handover.poll()
    assert not instance.tags and not stopped
    launched, instance, stopped = _handover(sensor=False)  # launched by hand: no successor would come
    instance.latest[CHECK] = SimpleNamespace(run_id="by-hand")
    instance.runs["by-hand"] = SimpleNamespace(tags={})
    launched.poll()
    assert not instance.tags and not stopped
