"""Prometheus metrics of a backfill running in this process (`backfill --metrics-port`): rows read and
dropped and pages, per table, from the runner's Progress (refreshed with its progress lines). The figures
are the backfill's own (all its runs, as `backfill list` shows them), so a resumed one goes on counting from
where it was; the label is the table, never the backfill's id."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def backfill_metrics(backfillers: list[Any]) -> Iterator[Metric]:
    """``backfillers``: objects with a ``progress`` (backfill.progress.Progress, None before it starts)."""
    read = CounterMetricFamily("cdc_backfill_rows_read", "Rows of the pages the drain reconciled",
                               labels=["table"])
    dropped = CounterMetricFamily("cdc_backfill_rows_dropped", "Rows dropped as stale (a change represents the "
                                  "row)", labels=["table"])
    pages = CounterMetricFamily("cdc_backfill_pages", "Pages the drain reconciled", labels=["table"])
    staged = CounterMetricFamily("cdc_backfill_pages_staged", "Pages read and staged", labels=["table"])
    estimated = GaugeMetricFamily("cdc_backfill_estimated_rows", "The planner's estimate of the rows to read",
                                  labels=["table"])
    totals: dict[str, list[int]] = {}
    for runner in backfillers:
        p = getattr(runner, "progress", None)
        if p is None:
            continue
        t = totals.setdefault(p.spec.table, [0, 0, 0, 0, 0])
        for i, value in enumerate((p.rows_read, p.rows_dropped, p.pages, p.pages_staged, p.estimated_rows or 0)):
            t[i] += value
    for table, (r, d, pg, st, est) in totals.items():
        read.add_metric([table], r)
        dropped.add_metric([table], d)
        pages.add_metric([table], pg)
        staged.add_metric([table], st)
        estimated.add_metric([table], est)
    yield from (read, dropped, pages, staged, estimated)
