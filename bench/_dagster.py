"""bench/e2e.py --dagster: the lag phase through `dagster dev` on the project's workspace (default
config, sensors on), the runs it launched, what the streaming runs wrote to Dagster's event log over the
window (per asset, scaled to an hour), and with --block how long a blocked sink takes to turn
`lag_below_max` red."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import psycopg

from bench._common import table
from bench._events import MachineLoad, block_sink, count_events, event_lines
from bench._lag import measure_lag, sink_position, wait_until
from cdc_pipeline.postgres import embedded

SEED = 10_000  # rows the offered load's updates pick from


def run_through_dagster(cluster: embedded.EmbeddedPostgres, cfg: Path, state_dsn: str, rate: int, seconds: float,
                        quiet: float, work: Path, sinks: list[str], block: float | None) -> None:
    """`sinks`: the config's sink names (the first, `mirror`, is the one whose lag is measured); `block`:
    None, or the sink's `max_lag_seconds` to block it after the window and time its lag check's turn red."""
    from dagster import AssetKey, DagsterInstance

    from cdc_pipeline.demo.dagster_dev import DagsterDev, storage_url

    cluster.create_database("dagster")
    storage = cluster.dsn("dagster")
    os.environ["DAGSTER_PG_URL"] = storage_url(storage)  # for DagsterInstance.from_config below
    home = work / "dagster_home"
    src, dst = cluster.dsn("src"), cluster.dsn("dst")
    with open(work / "dagster.log", "wb") as log, DagsterDev(home, cfg, storage, log=log) as dev:
        t0 = time.monotonic()
        dev.wait_loaded()
        loaded = time.monotonic() - t0
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("INSERT INTO orders (id, account, amount, status, ver) "
                         "SELECT g, g %% 1000, 1, 'seed', 0 FROM generate_series(1, %s) g", (SEED,))
        state = psycopg.connect(state_dsn, autocommit=True)
        for sink in sinks:
            wait_until(lambda s=sink: sink_position(state, s)[1] >= SEED, 600, f"the seed rows in {sink}", step=0.5)
        warm = time.monotonic() - t0
        print(f"dagster dev: code location loaded after {loaded:.1f} s; seed rows in the mirror after {warm:.1f} s "
              "(drain and delivery runs started by the sensors, Spark warmed up)")
        with DagsterInstance.from_config(str(home)) as instance:
            before = {r.run_id for r in instance.get_runs()}
            t1 = time.monotonic()
            machine_load = MachineLoad()
            lags, load = measure_lag(src, dst, state, rate, seconds, SEED + 1, quiet)
            busy = machine_load.stop()
            window = time.monotonic() - t1
            runs = instance.get_runs()
            new = [r for r in runs if r.run_id not in before]
            alive = sorted(f"{r.job_name} ({r.status.value})" for r in runs)
            started = {r.dagster_run.job_name: r.start_time for r in instance.get_run_records()}
            load_window = load.ended_at - load.started_at
            events = count_events(instance, load.started_at, load.ended_at)
            blocked = None
            if block is not None:
                blocked = block_sink(instance, src, dst, "mirror.orders", AssetKey(["sink", sinks[0]]), rate,
                                     load.next_id, block)
        ticks = {name: [t["endTimestamp"] - t["timestamp"] for t in dev.sensor_ticks(name) if t["endTimestamp"]]
                 for name in ("cdc_drain_sensor", "cdc_delivery_sensor")}
        state.close()
    q = statistics.quantiles(lags, n=100)
    p50, p95, p99 = q[49], q[94], q[98]
    per_hour = len(new) * 3600 / window
    print(f"offered {rate:,} changes/s for {seconds:.0f} s through dagster dev: achieved {load.achieved:,.0f} "
          f"changes/s ({load.changes:,} in {load_window:.1f} s; generator at most {load.behind:.2f} s behind); "
          f"{len(lags):,} changes: lag p50 {p50:.3f} s, p95 {p95:.3f} s, p99 {p99:.3f} s, max {lags[-1]:.3f} s")
    print(busy)
    print("runs started (seconds before the load's start): "
          + ", ".join(f"{job} {load.started_at - t:.0f} s" for job, t in sorted(started.items()) if t))
    print(f"runs: {len(runs)} in all ({', '.join(alive)}); {len(new)} launched during the {window:.0f} s "
          "measurement")
    slowest = {k: max(v, default=0.0) for k, v in ticks.items()}
    print("slowest sensor evaluation: " + ", ".join(f"{k} {v:.2f} s ({len(ticks[k])} ticks)"
                                                    for k, v in slowest.items()))
    print()
    print(table([
        (f"lag p50 at {rate:,}/s through dagster dev", f"{p50:.2f} s", "<= 0.5 s"),
        (f"lag p99 at {rate:,}/s through dagster dev", f"{p99:.2f} s", "<= 1 s"),
        (f"lag max at {rate:,}/s through dagster dev", f"{lags[-1]:.2f} s", ""),
        ("runs launched in steady state", f"{per_hour:.0f} per hour ({len(new)} in {window:.0f} s)",
         "<= 1 per sink per delivery.run_minutes"),
        ("runs in all (active and finished)", str(len(runs)), "1 + 1 per sink active"),
        ("slowest sensor evaluation", f"{max(slowest.values()):.2f} s", "<= 30 s"),
    ], ("measure", "result", "target")))
    print()
    print(f"Dagster event log over the load's {load_window:.0f} s (every run and the sensors' runless events):")
    print(table(event_lines(events, load_window), ("asset", "materializations", "check evaluations",
                                                   "per hour (target <= 60 + 60)")))
    if blocked is not None:
        assert block is not None
        red = "never" if blocked.red_after is None else f"{blocked.red_after:.1f} s"
        green = "never" if blocked.green_after is None else f"{blocked.green_after:.1f} s"
        print()
        print(f"sink {sinks[0]} blocked (its table locked) at {blocked.load.achieved:,.0f} changes/s: lag_below_max "
              f"red after {red} (target <= max_lag_seconds {block:.0f} + 30 = {block + 30:.0f} s); "
              f"green again {green} after the release")
        print(table(event_lines(blocked.events, blocked.window), ("asset", "materializations", "check evaluations",
                                                                  f"per hour (over {blocked.window:.0f} s)")))
