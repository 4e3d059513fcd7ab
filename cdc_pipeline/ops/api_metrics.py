"""Prometheus metrics of `api-sync`: this process's requests, records and failures per source (from its
SourceSyncs' stats), and the budget and lag figures `status` shows (requests used vs the budget per window,
the pause, lag per collection). Labels: the configured source and collection names, nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def api_counters(syncs: list[Any]) -> Iterator[Metric]:
    """``syncs``: objects with ``source.name`` and ``stats`` (api_sync.loop.SourceSync)."""
    requests = CounterMetricFamily("cdc_api_requests", "API requests this process sent (each took a budget slot)",
                                   labels=["source"])
    written = CounterMetricFamily("cdc_api_records_written", "Records this process inserted or updated",
                                  labels=["source"])
    deleted = CounterMetricFamily("cdc_api_records_deleted", "Records this process deleted", labels=["source"])
    failures = CounterMetricFamily("cdc_api_failures", "Collection turns that failed (then cooled down)",
                                   labels=["source"])
    for sync in syncs:
        name, stats = sync.source.name, sync.stats
        requests.add_metric([name], stats.requests)
        written.add_metric([name], stats.records)
        deleted.add_metric([name], stats.deleted)
        failures.add_metric([name], stats.failures)
    yield from (requests, written, deleted, failures)


def api_gauges(figures: dict[str, Any]) -> Iterator[Metric]:
    """``figures``: `status`'s ``api_sync`` part (api_sync/lag.py's collect)."""
    def gauge(name: str, doc: str, labels: tuple[str, ...] = ("source",)) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=list(labels))

    used = gauge("cdc_api_requests_in_window", "Requests sent in the last rate-limit window, all processes")
    budget = gauge("cdc_api_request_budget", "Requests allowed per window (the share of the quota)")
    window = gauge("cdc_api_window_seconds", "The rate-limit window")
    paused = gauge("cdc_api_paused_seconds", "Seconds left of a pause the API asked for (429, exhausted quota)")
    max_lag = gauge("cdc_api_computed_max_lag_seconds", "Max lag the budget allows every collection")
    coll = ("source", "collection")
    lag = gauge("cdc_api_lag_seconds", "Age of the last completed poll's start: changes since may be missing", coll)
    backfill = gauge("cdc_api_backfill_records", "Records the collection's backfill read", coll)
    backfilling = gauge("cdc_api_backfilling", "1 while the collection is in its backfill", coll)
    for source, src in figures.items():
        if "error" in src:
            continue
        used.add_metric([source], src["requests_in_window"])
        budget.add_metric([source], src["budget_per_window"])
        window.add_metric([source], src["window_seconds"])
        paused.add_metric([source], src["paused_for_seconds"])
        max_lag.add_metric([source], src["computed_max_lag_seconds"])
        for name, c in src["collections"].items():
            if c["lag_seconds"] is not None:
                lag.add_metric([source, name], c["lag_seconds"])
            backfill.add_metric([source, name], c["backfill_records"])
            backfilling.add_metric([source, name], int(c["phase"] in ("backfill", "not started")))
    yield from (used, budget, window, paused, max_lag, lag, backfill, backfilling)
