"""Lanes (`lanes: N`): what splitting one sink over N `deliver --lane I` processes gains, for the Postgres mirror
and NATS JetStream (issue 23).

    .venv/bin/python bench/lanes.py                          # 20,000 rows x 3 versions, lanes 1 and 2
    .venv/bin/python bench/lanes.py --rows 50000 --lanes 1,2,4 --sinks pg_mirror,nats --wait-quiet 30

A throwaway durable cluster; a table of `--rows` rows, each inserted then updated twice; `drain --until-idle`;
then per sink type and lane count a fresh sink delivered by one `cdc-pipeline deliver --sink S --lane I
--until-idle` process per lane, all started at once and timed until the last exits (start-up included).
Each lane reads only its share of the log when the database can compute its groups (here: table and key),
and prints the log rows it read (`rows_read`, shown per lane); before that, every lane read the whole log.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import (  # noqa: E402 - runnable as a script
    CLI,
    cpu_busy,
    keep_or_destroy,
    machine,
    run_cli,
    start_cluster,
    table,
    wait_quiet,
    write_config,
)
from cdc_pipeline.postgres import embedded  # noqa: E402


def destination(kind: str, dest_dsn: str, name: str) -> dict[str, object]:
    if kind == "pg_mirror":
        return {"type": "postgres", "dsn": dest_dsn, "table": f"{name}.{{table}}", "mode": "mirror"}
    if kind == "nats":
        return {"type": "nats", "subject": f"bench.{name}", "stream": f"BENCH_{name.upper()}"}
    raise SystemExit(f"unknown sink type {kind!r} (pg_mirror, nats)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--lanes", default="1,2", help="lane counts, comma-separated")
    ap.add_argument("--sinks", default="pg_mirror,nats", help="sink types: pg_mirror, nats")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="before each timed run, wait up to S seconds for the CPUs to be idle")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    lane_counts = [int(n) for n in args.lanes.split(",")]
    print(machine())
    cluster = start_cluster(durable=True)
    work = Path(tempfile.mkdtemp(prefix="cdc_bench_lanes_"))
    rows: list[tuple[str, ...]] = []
    try:
        cluster.create_database("src")
        cluster.create_database("dst")
        src = cluster.dsn("src")
        stamp = int(time.time())
        sinks = [{"name": f"{kind}_{n}_{stamp}".replace("pg_", "pg"), "tables": ["public.items"], "lanes": n,
                  "destination": destination(kind, cluster.dsn("dst"), f"{kind.replace('pg_', 'pg')}_{n}_{stamp}")}
                 for kind in args.sinks.split(",") for n in lane_counts]
        cfg = write_config(work / "cdc.yaml", {
            "source": {"dsn": src, "slot": "bench", "publication": "bench"},
            "tables": [{"name": "public.items"}], "sinks": sinks})
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, ver int NOT NULL, note text NOT NULL)")
        run_cli(cfg, "setup")
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("INSERT INTO items SELECT g, 0, 'v' FROM generate_series(1, %s) g", (args.rows,))
            conn.execute("UPDATE items SET ver = 1")
            conn.execute("UPDATE items SET ver = 2")
        run_cli(cfg, "drain", "--until-idle")
        total = 3 * args.rows
        for sink in sinks:
            busy = wait_quiet(args.wait_quiet) if args.wait_quiet else cpu_busy(1.0)
            cpu0, server0 = _children_cpu(), server_cpu(cluster)
            t0 = time.monotonic()
            procs = [subprocess.Popen([CLI, "--config", str(cfg), "deliver", "--sink", str(sink["name"]), "--lane",
                                       str(i), "--until-idle"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for i in range(int(sink["lanes"]))]  # type: ignore[call-overload]
            outputs = [p.communicate() for p in procs]
            seconds = time.monotonic() - t0
            cpu = _children_cpu() - cpu0  # the lanes' own CPU (start-up included): less swayed by load than time
            server = server_cpu(cluster) - server0  # the state and destination databases' work for them
            if any(p.returncode for p in procs):
                raise SystemExit(f"deliver failed: {outputs}")
            rows.append((str(sink["destination"]["type"]), str(sink["lanes"]), f"{total:,}",  # type: ignore[index]
                         f"{total / seconds:,.0f}", f"{seconds:.2f}", f"{cpu:.2f}", f"{server:.2f}", rows_read(outputs), f"{busy:.0%}"))
            print(rows[-1], flush=True)
    finally:
        keep_or_destroy(cluster, args.keep)
    print(table(rows, ("sink", "lanes", "messages", "msgs/s (processes)", "seconds", "CPU s", "server CPU s",
                       "rows read per lane",
                       "CPU busy before")))


def server_cpu(cluster: embedded.EmbeddedPostgres) -> float:
    """CPU seconds of the bench cluster's server so far: the postmaster, its live processes, and those it has
    reaped (the backends of connections already closed)."""
    tick = os.sysconf("SC_CLK_TCK")
    master = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile: reaped, so counted in the postmaster's
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == master:
            total += sum(int(f) for f in fields[11:15])  # its own time and its reaped children's
        elif ppid == master:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rows_read(outputs: list[tuple[bytes, bytes]]) -> str:
    """Each lane's `rows_read`, from the `sink S#I/N: {...}` line `deliver` prints when it ends."""
    found = []
    for out, _ in outputs:
        for line in out.decode().splitlines():
            if line.startswith("sink ") and ": {" in line:
                found.append(str(json.loads(line.split(": ", 1)[1]).get("rows_read", "-")))
    return " / ".join(f"{int(n):,}" if n.isdigit() else n for n in found)


if __name__ == "__main__":
    main()
