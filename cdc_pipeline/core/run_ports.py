"""The metrics ports of the long-lived Dagster runs (`metrics.run_ports_from`): a fixed map, so a Prometheus
scrape config can name each run's target without asking Dagster where it runs.

    the drain run (`cdc_drain`)              run_ports_from
    sink lane i (sinks in config order,      run_ports_from + 1 + i
      each sink's lanes 0..N-1)

Example: sinks `a` (1 lane) and `b` (`lanes: 2`) from 9300: drain 9300, `deliver_a` 9301, `deliver_b_lane0`
9302, `deliver_b_lane1` 9303. A sink or lane added at the end keeps every other port; one inserted before
others shifts them. API-sync runs are not in the map: they end once caught up (`api-sync --metrics-port`
is the long-lived form). Pure: values in, values out (the config validates with it; ops/run_ports.py
reads a config's port).
"""

from __future__ import annotations

from collections.abc import Sequence

DRAIN: tuple[None, int] = (None, 0)  # the drain run's key in the map


def run_port_map(first: int, sinks: Sequence[tuple[str, int]]) -> dict[tuple[str | None, int], int]:
    """``sinks``: (name, lanes) in config order. Returns the drain's key, then (sink, lane) -> port."""
    ports: dict[tuple[str | None, int], int] = {DRAIN: first}
    for name, lanes in sinks:
        for lane in range(lanes):
            ports[(name, lane)] = first + len(ports)
    return ports


def run_ports_problem(first: int, sinks: Sequence[tuple[str, int]], metrics_port: int | None) -> str | None:
    """Why ``first`` cannot start the map (the range leaves 1..65535 or holds `metrics.port`), else None."""
    last = first + sum(lanes for _, lanes in sinks)
    runs = f"ports {first}-{last} (the drain run and {last - first} delivery run(s), one per sink lane)"
    if first < 1 or last > 65535:
        return f"{runs} do not fit in 1-65535"
    if metrics_port and first <= metrics_port <= last:  # port 0 (any free port) cannot collide
        return f"{runs} include metrics.port {metrics_port}"
    return None
