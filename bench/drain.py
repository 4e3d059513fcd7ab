"""Drain throughput: slot -> committed change log, beside pg_recvlogical on the same connection type.

    .venv/bin/python bench/drain.py [--repeat 3] [--separate-state] [--wait-quiet 300] [--no-durable] [--keep]

For each connection type (Unix socket, TCP 127.0.0.1): two fresh slots see the same WAL, 1,000,000
single-row UPDATEs in 10,000-row transactions (`UPDATE t SET v = v + 1 WHERE id BETWEEN ..`) and an
end marker. Then
  * pg_recvlogical (pgoutput, proto_version 1, -f /dev/null, --endpos = the end) reads one slot;
  * `cdc-pipeline drain` reads the other, writing the change log in the same cluster (the default
    deployment: state in the source database); timed from process start until its slot_progress says
    the marker's transaction is committed to the log. With --separate-state, also with the state
    database in a second cluster, so the walsender does not decode the log's own writes.
Last, the drain's peak RSS (VmHWM) while it drains one 1,000,000-row transaction.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import (  # noqa: E402 - runnable as a script
    MB,
    PG_BIN,
    PeakRss,
    cpu_busy,
    current_lsn,
    keep_or_destroy,
    lsn_text,
    machine,
    run_cli,
    spawn,
    start_cluster,
    table,
    wait_quiet,
    write_config,
)

PUBLICATION = "bench"


def config(path: Path, dsn: str, slot: str, schema: str, tables: list[str], state_dsn: str | None = None) -> Path:
    return write_config(path, {
        "source": {"dsn": dsn, "slot": slot, "publication": PUBLICATION},
        "state": {"schema": schema, **({"dsn": state_dsn} if state_dsn else {})},
        "tables": [{"name": t} for t in tables],
        "sinks": [],
    })


def updates(dsn: str, rows: int, txn_rows: int) -> tuple[int, float]:
    """Run the UPDATE load; return (end LSN after the marker, seconds)."""
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for lo in range(1, rows + 1, txn_rows):
            conn.execute("UPDATE t SET v = v + 1 WHERE id BETWEEN %s AND %s", (lo, lo + txn_rows - 1))
        conn.execute("SELECT pg_logical_emit_message(true, 'bench', 'end')")
    return current_lsn(dsn), time.monotonic() - started


def recvlogical(dsn: str, slot: str, end: int) -> float:
    started = time.monotonic()
    subprocess.run([str(PG_BIN / "pg_recvlogical"), "-d", dsn, "--slot", slot, "--start", "--no-loop",
                    "-o", "proto_version=1", "-o", f"publication_names={PUBLICATION}", "-f", "/dev/null",
                    f"--endpos={lsn_text(end)}"], check=True, capture_output=True)
    return time.monotonic() - started


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_cpu() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


@dataclass
class DrainRun:
    seconds: float
    peak_rss: int
    cpu_seconds: float  # the drain process's own CPU time
    machine_busy: float  # fraction of all CPUs busy meanwhile (drain, walsender, state backend, ...)


def our_drain(cfg: Path, state_dsn: str, schema: str, slot: str, end: int, log: Path) -> DrainRun:
    """Time from process start until the log has committed everything up to `end`."""
    t0, i0 = _machine_cpu()
    started = time.monotonic()
    proc = spawn(cfg, "drain", "--seconds", "3600", log=log)
    rss = PeakRss(proc.pid)
    with psycopg.connect(state_dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(f"SELECT committed_lsn FROM {schema}.slot_progress WHERE slot = %s",
                               (slot,)).fetchone()
            if row and row[0] >= end:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"drain exited early:\n{log.read_text()}")
            time.sleep(0.01)
    elapsed = time.monotonic() - started
    cpu = _proc_cpu(proc.pid)
    t1, i1 = _machine_cpu()
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)
    rss.join(5)
    return DrainRun(elapsed, rss.peak, cpu, 1 - (i1 - i0) / max(1, t1 - t0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txn-rows", type=int, default=10_000)
    ap.add_argument("--big-txn-rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=1, help="rounds per connection type (fresh slots each)")
    ap.add_argument("--separate-state", action="store_true",
                    help="also measure with the state database in a second cluster (its WAL not decoded)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="before each measurement, wait up to S seconds for other work to leave the CPUs idle")
    ap.add_argument("--no-durable", action="store_true", help="fsync=off etc. on the bench clusters")
    ap.add_argument("--keep", action="store_true", help="keep the clusters afterwards")
    args = ap.parse_args()

    durable = not args.no_durable
    print(machine())
    print(f"cluster durable={durable}; {args.rows:,} updates in {args.rows // args.txn_rows} transactions")
    cluster = start_cluster(durable)
    state_cluster = start_cluster(durable) if args.separate_state else None
    work = Path(tempfile.mkdtemp(prefix="cdc_bench_"))
    results: list[tuple[str, ...]] = []
    try:
        cluster.create_database("bench")
        unix, tcp = cluster.dsn("bench"), cluster.dsn("bench", tcp=True)
        with psycopg.connect(unix, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id integer PRIMARY KEY, v integer NOT NULL)")
            conn.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, %s) g", (args.rows,))
            conn.execute("CREATE TABLE t2 (id integer PRIMARY KEY, v integer NOT NULL)")
            conn.execute("VACUUM ANALYZE t")
        variants = [("unix socket", unix, None), ("tcp 127.0.0.1", tcp, None)]
        if state_cluster is not None:
            state_cluster.create_database("state")
            variants += [("unix socket, state in another cluster", unix, state_cluster.dsn("state")),
                         ("tcp, state in another cluster", tcp, state_cluster.dsn("state", tcp=True))]

        rounds: dict[str, list[tuple[float, DrainRun]]] = {}
        for r in range(args.repeat):
            for n, (kind, dsn, state_dsn) in enumerate(variants):
                tag = f"v{n}_{r}"
                ours, recv, schema = f"ours_{tag}", f"recv_{tag}", f"bench_{tag}"
                cfg = config(work / f"{tag}.yaml", dsn, ours, schema, ["public.t"], state_dsn)
                run_cli(cfg, "setup")
                with psycopg.connect(unix, autocommit=True) as conn:
                    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (recv,))
                    start = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()[0]  # type: ignore[index]
                end, load_s = updates(unix, args.rows, args.txn_rows)
                busy = wait_quiet(args.wait_quiet) if args.wait_quiet else cpu_busy(0.5)
                ref = recvlogical(dsn, recv, end)
                run = our_drain(cfg, state_dsn or dsn, schema, ours, end, work / f"{tag}.log")
                print(f"[{kind} #{r + 1}] {(end - start) / MB:.0f} MB of WAL in {load_s:.1f} s; CPUs {100 * busy:.0f}% "
                      f"busy before; pg_recvlogical {ref:.2f} s ({args.rows / ref:,.0f}/s); cdc-pipeline drain "
                      f"{run.seconds:.2f} s ({args.rows / run.seconds:,.0f}/s, {run.cpu_seconds:.1f} s of CPU, "
                      f"all CPUs {100 * run.machine_busy:.0f}% busy meanwhile, peak RSS {run.peak_rss / MB:.0f} MB)")
                rounds.setdefault(kind, []).append((args.rows / ref, run))
                with psycopg.connect(unix, autocommit=True) as conn:
                    for slot in (recv, ours):
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    conn.execute("VACUUM t")
                with psycopg.connect(state_dsn or unix, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")
        for kind, runs in rounds.items():
            ref_rate = statistics.median(x[0] for x in runs)
            our_rate = statistics.median(args.rows / x[1].seconds for x in runs)
            cpu = statistics.median(x[1].cpu_seconds / x[1].seconds for x in runs)
            busy = statistics.median(x[1].machine_busy for x in runs)
            results.append((kind, f"{ref_rate:,.0f}", f"{our_rate:,.0f}", f"{100 * our_rate / ref_rate:.0f}%",
                            f"{100 * cpu:.0f}% / {100 * busy:.0f}%",
                            f"{max(x[1].peak_rss for x in runs) / MB:.0f} MB"))

        # Peak RSS through one 1,000,000-row transaction.
        cfg = config(work / "big.yaml", unix, "ours_big", "bench_big", ["public.t2"])
        run_cli(cfg, "setup")
        with psycopg.connect(unix, autocommit=True) as conn:
            conn.execute("INSERT INTO t2 SELECT g, g FROM generate_series(1, %s) g", (args.big_txn_rows,))
        end = current_lsn(unix)
        if args.wait_quiet:
            wait_quiet(args.wait_quiet)
        big = our_drain(cfg, unix, "bench_big", "ours_big", end, work / "big.log")
        print(f"[1M-row transaction] drained in {big.seconds:.1f} s ({args.big_txn_rows / big.seconds:,.0f}/s), "
              f"peak RSS {big.peak_rss / MB:.0f} MB")

        print()
        print(f"medians of {args.repeat} round(s):")
        print(table(results, ("connection", "pg_recvlogical changes/s", "cdc-pipeline drain changes/s",
                              "ratio (target >= 40%)", "drain CPU / all CPUs busy", "drain peak RSS")))
        print(f"\nsingle {args.big_txn_rows:,}-row transaction: drain peak RSS {big.peak_rss / MB:.0f} MB "
              f"(target <= 1024 MB), {args.big_txn_rows / big.seconds:,.0f} changes/s")
    finally:
        keep_or_destroy(cluster, args.keep)
        if state_cluster is not None:
            keep_or_destroy(state_cluster, args.keep)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
