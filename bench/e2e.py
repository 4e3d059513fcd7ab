"""End to end: source commit -> change log -> Spark -> Postgres mirror, with `cdc-pipeline drain` and
`cdc-pipeline deliver` running concurrently as separate processes.

    .venv/bin/python bench/e2e.py [--backlog 500000 (0: the lag phase alone)] [--rate 2000] [--seconds 60] [--wait-quiet S]
                                  [--no-durable] [--keep]
                                  [--drain-batch-ms MS] [--idle-seconds S] [--batch-size N] [--dagster] [--run-minutes M]
                                  [--second-sink] [--block]

1. Sustained throughput: with delivery warm and the drain stopped, a backlog of inserts and updates
   (1,000-row transactions) is committed; then the drain starts. Reported: changes/s from the drain's
   start until the mirror holds the last change (and the mirror is compared with the source).
2. Lag at an offered load (default 2,000 changes/s for 60 s; 100 transactions/s of 10 inserts and
   10 updates). Lag of a change = commit time of the mirror transaction that first reflects it (a
   trigger on the mirror logs each row write with its xid; `track_commit_timestamp = on` gives the
   commit time) minus the source transaction's commit time (from the change log). One cluster, one clock.

With --dagster: instead of the CLI processes, `dagster dev` on the project's workspace (default config,
sensors on, Postgres storage in the same cluster) drains and delivers through its long-lived runs; the
lag phase (2.) is measured the same way, with the runs launched, the slowest sensor evaluation, and the
materializations and check evaluations each asset recorded over the load's window (per hour). With
--second-sink a second mirror sink (`mirror2`, its own schema) streams beside the first; with --block the
first sink's table is then locked while the load goes on, and the time until `lag_below_max` is
recorded failed is reported against `delivery.max_lag_seconds` + 30 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import (  # noqa: E402 - runnable as a script
    keep_or_destroy,
    machine,
    run_cli,
    spawn,
    start_cluster,
    table,
    wait_quiet,
    write_config,
)
from bench._lag import (  # noqa: E402 - runnable as a script
    log_head,
    measure_lag,
    sink_position,
    table_digest,
    wait_until,
)

DDL = """
CREATE TABLE orders (id bigint PRIMARY KEY, account integer NOT NULL, amount numeric(12,2) NOT NULL,
                     status text NOT NULL, ver bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())
"""
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backlog", type=int, default=500_000)
    ap.add_argument("--rate", type=int, default=2_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--drain-batch-ms", type=int, default=None, help="drain.batch_ms (default: the config's)")
    ap.add_argument("--idle-seconds", type=float, default=None, help="delivery.idle_seconds (default: the config's)")
    ap.add_argument("--batch-size", type=int, default=None, help="delivery.batch_size (default: the config's)")
    ap.add_argument("--spark-master", default="local[*]")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="before each phase, wait up to S seconds for other work to leave the CPUs idle")
    ap.add_argument("--no-durable", action="store_true", help="fsync=off etc. on the bench cluster")
    ap.add_argument("--keep", action="store_true", help="keep the cluster and logs afterwards")
    ap.add_argument("--run-minutes", type=float, default=None,
                    help="drain.run_minutes and delivery.run_minutes (default: the config's); short values "
                         "show the handover between long-lived runs under load")
    ap.add_argument("--dagster", action="store_true",
                    help="drain and deliver through `dagster dev` (its sensors and long-lived runs) instead of "
                         "the CLI processes; measures the lag phase, the runs launched and the event log")
    ap.add_argument("--second-sink", action="store_true", help="with --dagster: a second mirror sink beside the first")
    ap.add_argument("--block", action="store_true",
                    help="with --dagster: after the lag phase, block the sink and time lag_below_max turning red")
    args = ap.parse_args()

    durable = not args.no_durable
    print(machine())
    cluster = start_cluster(durable, {"track_commit_timestamp": "on"})
    work = Path(tempfile.mkdtemp(prefix="cdc_bench_e2e_"))
    procs: list[Any] = []
    try:
        cluster.create_database("src")
        cluster.create_database("dst")
        src, dst = cluster.dsn("src"), cluster.dsn("dst")
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute(DDL)
        drain_cfg: dict[str, Any] = {}
        if args.drain_batch_ms:
            drain_cfg["batch_ms"] = args.drain_batch_ms
        delivery_cfg: dict[str, Any] = {}
        if args.run_minutes:
            drain_cfg["run_minutes"] = delivery_cfg["run_minutes"] = args.run_minutes
        if args.idle_seconds:
            delivery_cfg["idle_seconds"] = args.idle_seconds
        if args.batch_size:
            delivery_cfg["batch_size"] = args.batch_size
        data: dict[str, Any] = {
            "source": {"dsn": src, "slot": "e2e", "publication": "e2e"},
            "spark": {"master": args.spark_master},
            **({"drain": drain_cfg} if drain_cfg else {}),
            **({"delivery": delivery_cfg} if delivery_cfg else {}),
            "tables": [{"name": "public.orders"}],
            "sinks": [{"name": "mirror", "tables": ["public.orders"],
                       "destination": {"type": "postgres", "dsn": dst, "table": "mirror.{table}", "mode": "mirror"}}],
        }
        if args.second_sink:
            data["sinks"].append({"name": "mirror2", "tables": ["public.orders"],
                                  "destination": {"type": "postgres", "dsn": dst, "table": "mirror2.{table}",
                                                  "mode": "mirror"}})
        cfg = write_config(work / "cdc.yaml", data)
        from cdc_pipeline.config import load_config

        config = load_config(cfg)
        print(f"cluster durable={durable}, track_commit_timestamp=on; drain.batch_ms={config.drain.batch_ms}, "
              f"delivery.idle_seconds={config.delivery.idle_seconds}, delivery.batch_size={config.delivery.batch_size}, "
              f"spark {args.spark_master}")
        run_cli(cfg, "setup")
        if args.dagster:
            from bench._dagster import run_through_dagster

            run_through_dagster(cluster, cfg, config.state_dsn, args.rate, args.seconds, args.wait_quiet, work,
                                [s.name for s in config.sinks],
                                config.delivery.max_lag_seconds if args.block else None)
            return

        # Warm up: delivery's JVM started, mirror table created by the sink.
        deliver = spawn(cfg, "deliver", "--seconds", "100000", log=work / "deliver.log")
        drain = spawn(cfg, "drain", "--seconds", "100000", log=work / "drain.log")
        procs += [deliver, drain]
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("INSERT INTO orders (id, account, amount, status, ver) "
                         "SELECT g, g % 1000, 1, 'warm', 0 FROM generate_series(1, 10) g")
        state = psycopg.connect(config.state_dsn, autocommit=True)
        wait_until(lambda: sink_position(state)[1] >= 10, 180, "warm-up delivery")
        os.killpg(drain.pid, signal.SIGTERM)
        drain.wait(60)

        # 1. Backlog (--backlog 0: the lag phase alone).
        n = args.backlog
        rows: list[tuple[str, str, str]] = []
        half = n // 2  # ids 11 .. 10 + half exist after the backlog, for the load's updates
        if n:
            rows = backlog_phase(cfg, src, dst, state, n, args.wait_quiet, work, procs)
        else:
            half = 10_000
            with psycopg.connect(src, autocommit=True) as conn:
                conn.execute("INSERT INTO orders (id, account, amount, status, ver) "
                             "SELECT g, g %% 1000, 1, 'new', 1 FROM generate_series(11, 10 + %s) g", (half,))
            procs.append(spawn(cfg, "drain", "--seconds", "100000", log=work / "drain2.log"))
            wait_until(lambda: sink_position(state)[1] >= 10 + half, 600, "the rows the load updates, delivered")

        # 2. Lag at the offered load.
        lags, load = measure_lag(src, dst, state, args.rate, args.seconds, 11 + half, args.wait_quiet)
        q = statistics.quantiles(lags, n=100)
        p50, p95, p99 = q[49], q[94], q[98]
        print(f"offered {load.changes / args.seconds:,.0f} changes/s for {args.seconds:.0f} s (generator at most "
              f"{load.behind:.2f} s behind); {len(lags):,} changes: lag p50 {1000 * p50:.0f} ms, p95 "
              f"{1000 * p95:.0f} ms, p99 {1000 * p99:.0f} ms, max {1000 * lags[-1]:.0f} ms")
        print()
        print(table([
            *rows,
            (f"lag p50 at {args.rate:,}/s", f"{1000 * p50:.0f} ms", "<= 50 ms"),
            (f"lag p95 at {args.rate:,}/s", f"{1000 * p95:.0f} ms", ""),
            (f"lag p99 at {args.rate:,}/s", f"{1000 * p99:.0f} ms", "<= 250 ms"),
            (f"lag max at {args.rate:,}/s", f"{1000 * lags[-1]:.0f} ms", ""),
        ], ("measure", "result", "target")))
        state.close()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except Exception:
                os.killpg(p.pid, signal.SIGKILL)
        if args.keep:
            print(f"logs in {work}")
        keep_or_destroy(cluster, args.keep)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def backlog_phase(cfg: Path, src: str, dst: str, state: psycopg.Connection, n: int, quiet: float, work: Path,
                  procs: list[Any]) -> list[tuple[str, str, str]]:
    """Phase 1: a backlog of n changes committed with the drain stopped, then drained and delivered."""
    half = n // 2
    t_load = time.monotonic()
    with psycopg.connect(src, autocommit=True) as conn:
        for lo in range(11, 11 + half, 1000):
            conn.execute("INSERT INTO orders (id, account, amount, status, ver) SELECT g, g %% 1000, 1, 'new', 1 "
                         "FROM generate_series(%s::bigint, %s::bigint) g", (lo, min(lo + 999, 10 + half)))
        for lo in range(11, 11 + (n - half), 1000):
            conn.execute("UPDATE orders SET ver = 2, amount = amount + 1, status = 'paid', updated_at = now() "
                         "WHERE id BETWEEN %s AND %s", (lo, min(lo + 999, 10 + n - half)))
    print(f"backlog: {n:,} changes committed in {time.monotonic() - t_load:.1f} s")
    if quiet:
        print(f"CPUs {100 * wait_quiet(quiet):.0f}% busy before phase 1")
    _, base_delivered = sink_position(state)
    _, base_count = log_head(state)
    t0 = time.monotonic()
    drain = spawn(cfg, "drain", "--seconds", "100000", log=work / "drain2.log")
    procs.append(drain)
    samples: list[tuple[float, int]] = []

    def drained() -> bool:
        samples.append((time.monotonic(), sink_position(state)[1] - base_delivered))
        return log_head(state)[1] - base_count >= n

    t_drained = wait_until(drained, 1800, "the drain to capture the backlog", step=0.25)
    target, _ = log_head(state)

    def delivered() -> bool:
        pos, count = sink_position(state)
        samples.append((time.monotonic(), count - base_delivered))
        return pos >= target

    t_done = wait_until(delivered, 1800, "the mirror to catch up", step=0.1)
    e2e = n / (t_done - t0)
    lo_t = next(t for t, c in samples if c >= 0.1 * n)
    hi_t = next(t for t, c in samples if c >= 0.9 * n)
    steady = 0.8 * n / (hi_t - lo_t) if hi_t > lo_t else float("nan")
    s_count, s_md5 = table_digest(src, "orders")
    m_count, m_md5 = table_digest(dst, "mirror.orders")
    equal = (s_count, s_md5) == (m_count, m_md5)
    print(f"backlog drained to the log in {t_drained - t0:.1f} s ({n / (t_drained - t0):,.0f}/s); "
          f"mirror caught up after {t_done - t0:.1f} s: {e2e:,.0f} changes/s end to end, "
          f"{steady:,.0f}/s delivery between 10% and 90%; mirror equals source: {equal}")

    return [
        (f"sustained, backlog of {n:,} changes", f"{e2e:,.0f} changes/s", ">= 20,000 changes/s"),
        ("  drain alone (slot -> log) meanwhile", f"{n / (t_drained - t0):,.0f} changes/s", ""),
        ("  delivery between 10% and 90%", f"{steady:,.0f} changes/s", ""),
    ]

if __name__ == "__main__":
    main()
