"""Prometheus metrics of a long-running command (`--metrics-port` / `metrics.port`), through
prometheus-client. Two kinds:

- counters of this process's own work, read from its runners at scrape time (changes logged, messages
  delivered/parked/retried per sink, outage retries, API requests (ops/api_metrics.py), backfill rows and
  pages (ops/backfill_metrics.py)) and the histograms recorded as the work happens (core/metrics_registry.py);
- gauges of the pipeline's state, from the same `status.collect` that `cdc-pipeline status` prints (slot lag
  bytes and seconds, retained WAL, sink lag and parked messages, pull queue depth, API budget and lag),
  refreshed at most every STATUS_SECONDS so a scrape never loads the database more than that.

Names carry their unit and `_total` for counters; labels are bounded: a sink's, table's, API source's or
collection's configured name, a queue state, never a key or an id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cdc_pipeline.capture.prefixes import OWN_PREFIXES
from cdc_pipeline.ops.api_metrics import api_counters, api_gauges
from cdc_pipeline.ops.backfill_metrics import backfill_metrics

log = logging.getLogger(__name__)

STATUS_SECONDS = 2.0


class PipelineCollector(Collector):
    """``runners()``: the drain, deliverers, API syncs and backfillers of this process (objects with a
    ``stats`` or ``progress`` attribute, read live)."""

    def __init__(self, status: Callable[[], dict[str, Any]], runners: Callable[[], list[Any]]) -> None:
        self._status_fn, self._runners = status, runners
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self.status_error: str | None = None

    def status(self) -> dict[str, Any]:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] >= STATUS_SECONDS:
                try:
                    self._cached = (time.monotonic(), self._status_fn())
                    self.status_error = None
                except Exception as exc:  # the state database may be down: the process's own counters still count
                    where = getattr(exc, "cdc_database", "state")  # admin/status.py marks the source's failures
                    self.status_error = f"{where} database: {type(exc).__name__}"
                    log.debug("metrics: status failed: %s", exc)
                    return self._cached[1] if self._cached else {}
            return self._cached[1]

    def collect(self) -> Iterator[Metric]:
        runners = self._runners()
        syncs = [r for r in runners if hasattr(r, "stats") and hasattr(r, "source")]
        backfills = [r for r in runners if hasattr(r, "progress")]
        yield from _own_counters([r for r in runners if r not in syncs and r not in backfills])
        if syncs:
            yield from api_counters(syncs)
        if backfills:
            yield from backfill_metrics(backfills)
        status = self.status()
        yield from _state_gauges(status)
        if status.get("api_sync"):
            yield from api_gauges(status["api_sync"])


def _own_counters(runners: list[Any]) -> Iterator[Metric]:
    logged = CounterMetricFamily("cdc_changes_logged", "Changes this drain wrote to the change log")
    txns = CounterMetricFamily("cdc_transactions_logged", "Source transactions this drain logged")
    reconnects = CounterMetricFamily("cdc_drain_retries", "Times this drain reconnected after a lost session")
    skipped = CounterMetricFamily("cdc_logical_messages_skipped", "Logical messages under one of the pipeline's "
                                  "prefixes whose content could not be used (skipped)", labels=["prefix"])
    families = {name: CounterMetricFamily(f"cdc_sink_messages_{name}", f"Messages {name} by this process",
                                          labels=["sink"])
                for name in ("delivered", "parked", "retried", "discarded", "filtered")}
    batches = CounterMetricFamily("cdc_sink_batches", "Batches sent by this process", labels=["sink"])
    rows_read = CounterMetricFamily("cdc_sink_rows_read", "Log rows this process read for the sink (a lane "
                                    "of a split hashed in SQL: only its share)", labels=["sink"])
    outages = CounterMetricFamily("cdc_sink_outage_retries", "Times delivery waited for its destination or "
                                  "the state database", labels=["sink"])
    drains = 0
    for runner in runners:
        stats = getattr(runner, "stats", None)
        if stats is None:
            continue
        if hasattr(stats, "changes"):  # DrainStats
            drains += 1
            logged.add_metric([], stats.changes)
            txns.add_metric([], stats.transactions)
            reconnects.add_metric([], stats.retries)
            for prefix in OWN_PREFIXES:
                skipped.add_metric([prefix], stats.skipped_messages.get(prefix, 0))
        else:  # DeliveryStats
            for name, family in families.items():
                family.add_metric([stats.sink], getattr(stats, name))
            batches.add_metric([stats.sink], stats.batches)
            rows_read.add_metric([stats.sink], stats.read)
            outages.add_metric([stats.sink], stats.outage_retries)
    if drains:
        yield from (logged, txns, reconnects, skipped)
    yield from (*families.values(), batches, rows_read, outages)


def _state_gauges(status: dict[str, Any]) -> Iterator[Metric]:
    source = status.get("source")
    if source and source.get("address"):  # which server source.dsn reaches, and the failovers the drain saw
        info = GaugeMetricFamily("cdc_source_server", "1 for the server source.dsn reaches (address, version, "
                                 "timeline)", labels=["address", "version", "timeline"])
        info.add_metric([source["address"], source["version"], str(source["timeline"])], 1)
        yield info
        yield GaugeMetricFamily("cdc_source_failovers", "Failovers the drain has seen (a session on another "
                                "server or timeline than the one before)", value=source["failovers"])
    slot = status.get("slot")
    if slot:
        yield GaugeMetricFamily("cdc_slot_lag_bytes", "WAL bytes the slot has not confirmed",
                                value=slot["lag_bytes"])
        yield GaugeMetricFamily("cdc_slot_lag_seconds", "Age of the last heartbeat the drain logged, while WAL "
                                "waits", value=slot["lag_seconds"])
        yield GaugeMetricFamily("cdc_slot_retained_wal_bytes", "WAL the server keeps for the slot",
                                value=slot["retained_bytes"])
        yield GaugeMetricFamily("cdc_slot_active", "1 while a process consumes the slot", value=int(slot["active"]))
    if status.get("log"):
        yield GaugeMetricFamily("cdc_log_messages", "Messages in the change log", value=status["log"]["messages"])
    lag = GaugeMetricFamily("cdc_sink_lag_messages", "Messages in the log after the sink's offset", labels=["sink"])
    lag_seconds = GaugeMetricFamily("cdc_sink_lag_seconds", "Age of the oldest change the sink has not had yet "
                                    "(0 when caught up)", labels=["sink"])
    parked = GaugeMetricFamily("cdc_sink_parked_messages", "Messages parked now", labels=["sink"])
    discarded = GaugeMetricFamily("cdc_sink_discarded_messages", "Messages discarded", labels=["sink"])
    oldest = GaugeMetricFamily("cdc_sink_oldest_parked_seconds", "Age of the oldest parked message",
                               labels=["sink"])
    waiting = GaugeMetricFamily("cdc_sink_waiting_for_destination", "1 while delivery waits for an outage to "
                                "end", labels=["sink"])
    pull = GaugeMetricFamily("cdc_pull_queue_messages", "Pull queue depth by state", labels=["sink", "state"])
    for name, sink in (status.get("sinks") or {}).items():
        lag.add_metric([name], sink["lag_messages"])
        lag_seconds.add_metric([name], sink.get("lag_seconds") or 0.0)
        parked.add_metric([name], sink.get("parked", 0))
        discarded.add_metric([name], sink.get("discarded", 0))
        oldest.add_metric([name], sink.get("oldest_parked_seconds") or 0)
        waiting.add_metric([name], int(bool(sink.get("waiting_for_destination"))))
        for state, n in (sink.get("pull_queue") or {}).items():
            pull.add_metric([name, state], n)
    yield from (lag, lag_seconds, parked, discarded, oldest, waiting, pull)
    schema = GaugeMetricFamily("cdc_schema_change_lsn", "Log position (LSN) of each table's last schema change "
                               "(capture/schema_changes.py)", labels=["table"])
    for table, change in (status.get("schema_changes") or {}).items():
        schema.add_metric([table], float(change.get("lsn") or 0))
    yield schema
