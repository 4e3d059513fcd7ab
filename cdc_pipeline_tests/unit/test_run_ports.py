"""The metrics ports of the long-lived Dagster runs (ops/run_ports.py): the documented map, and the config
refusing a range that leaves 1-65535 or holds `metrics.port`, naming the key."""

from __future__ import annotations

import pytest

from cdc_pipeline.config import ConfigError, parse_config
from cdc_pipeline.core.run_ports import DRAIN, run_port_map, run_ports_problem
from cdc_pipeline.ops.run_ports import run_port

SINKS = """\
source: {dsn: "postgresql://localhost/shop"}
tables: [{name: orders}]
sinks:
  - {name: a, tables: [orders], destination: {type: parquet, path: a}}
  - {name: b, tables: [orders], lanes: 2, destination: {type: parquet, path: b}}
  - {name: c, tables: [orders], destination: {type: parquet, path: c}}
"""


def test_the_map_is_drain_then_each_sink_lane_in_config_order() -> None:
    assert run_port_map(9300, [("a", 1), ("b", 2), ("c", 1)]) == {
        DRAIN: 9300, ("a", 0): 9301, ("b", 0): 9302, ("b", 1): 9303, ("c", 0): 9304}
    assert run_port_map(9300, []) == {DRAIN: 9300}


def test_a_sink_appended_keeps_every_other_port() -> None:
    before = run_port_map(9300, [("a", 1), ("b", 2)])
    after = run_port_map(9300, [("a", 1), ("b", 2), ("new", 3)])
    assert {k: after[k] for k in before} == before


def test_run_port_from_the_config() -> None:
    config = parse_config(SINKS + "metrics: {run_ports_from: 9300}\n", "cdc.yaml", {})
    assert run_port(config) == 9300
    assert [run_port(config, "b", lane) for lane in (0, 1)] == [9302, 9303]
    assert run_port(config, "c") == 9304
    assert run_port(config, "b", 2) is None  # not a lane of b
    assert run_port(parse_config(SINKS, "cdc.yaml", {}), "a") is None  # off by default


@pytest.mark.parametrize(("metrics", "error"), [
    ("{run_ports_from: 65532}", "cdc.yaml: metrics.run_ports_from: ports 65532-65536 (the drain run and 4 "
                                "delivery run(s), one per sink lane) do not fit in 1-65535"),
    ("{port: 9303, run_ports_from: 9300}", "cdc.yaml: metrics.run_ports_from: ports 9300-9304 (the drain run "
                                           "and 4 delivery run(s), one per sink lane) include metrics.port 9303"),
    ("{run_ports_from: 0}", "cdc.yaml: metrics.run_ports_from: must be at least 1 (got 0)"),
])
def test_a_range_that_does_not_fit_is_a_config_error_naming_the_key(metrics: str, error: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(SINKS + f"metrics: {metrics}\n", "cdc.yaml", {})
    assert str(info.value) == error


def test_ranges_that_fit() -> None:
    assert run_ports_problem(65531, [("a", 1), ("b", 2), ("c", 1)], None) is None  # 65531-65535
    assert run_ports_problem(9300, [("a", 1)], 9302) is None  # metrics.port just past the range
    assert run_ports_problem(9300, [("a", 1)], 0) is None  # port 0: any free port, no collision
    parse_config(SINKS + "metrics: {port: 9299, run_ports_from: 9300}\n", "cdc.yaml", {})
