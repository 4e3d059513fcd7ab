"""Drain throughput: slot -> committed change log, beside pg_recvlogical on the same connection type.

    .venv/bin/python bench/drain.py [--rows 1000000] [--txn-rows 10000] [--no-durable] [--keep]

For each connection type (Unix socket, TCP 127.0.0.1): two fresh slots see the same WAL, 1,000,000
single-row UPDATEs in 10,000-row transactions (`UPDATE t SET v = v + 1 WHERE id BETWEEN ..`) and an
end marker. Then
  * pg_recvlogical (pgoutput, proto_version 1, -f /dev/null, --endpos = the end) reads one slot;
  * `cdc-pipeline drain` reads the other, writing the change log in the same cluster (the default
    deployment: state in the source database); timed from process start until its slot_progress says
    the marker's transaction is committed to the log.
Last, the drain's peak RSS (VmHWM) while it drains one 1,000,000-row transaction.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import (  # noqa: E402 - runnable as a script
    MB,
    PG_BIN,
    PeakRss,
    current_lsn,
    keep_or_destroy,
    lsn_text,
    machine,
    run_cli,
    spawn,
    start_cluster,
    table,
    write_config,
)

PUBLICATION = "bench"


def config(path: Path, dsn: str, slot: str, schema: str, tables: list[str]) -> Path:
    return write_config(path, {
        "source": {"dsn": dsn, "slot": slot, "publication": PUBLICATION},
        "state": {"schema": schema},
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


def our_drain(cfg: Path, dsn: str, schema: str, slot: str, end: int, log: Path,
              until_idle: bool = False) -> tuple[float, int]:
    """Seconds from process start until the log has committed everything up to `end`; peak RSS."""
    started = time.monotonic()
    args = ("drain", "--until-idle") if until_idle else ("drain", "--seconds", "3600")
    proc = spawn(cfg, *args, log=log)
    rss = PeakRss(proc.pid)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(f"SELECT committed_lsn FROM {schema}.slot_progress WHERE slot = %s",
                               (slot,)).fetchone()
            if row and row[0] >= end:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"drain exited early:\n{log.read_text()}")
            time.sleep(0.01)
    elapsed = time.monotonic() - started
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)
    rss.join(5)
    return elapsed, rss.peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txn-rows", type=int, default=10_000)
    ap.add_argument("--big-txn-rows", type=int, default=1_000_000)
    ap.add_argument("--no-durable", action="store_true", help="fsync=off etc. on the bench cluster")
    ap.add_argument("--keep", action="store_true", help="keep the cluster afterwards")
    args = ap.parse_args()

    durable = not args.no_durable
    print(machine())
    print(f"cluster durable={durable}; {args.rows:,} updates in {args.rows // args.txn_rows} transactions")
    cluster = start_cluster(durable)
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

        for kind, dsn in (("unix socket", unix), ("tcp 127.0.0.1", tcp)):
            tag = kind.split()[0]
            ours, recv, schema = f"ours_{tag}", f"recv_{tag}", f"bench_{tag}"
            cfg = config(work / f"{tag}.yaml", dsn, ours, schema, ["public.t"])
            run_cli(cfg, "setup")
            with psycopg.connect(unix, autocommit=True) as conn:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (recv,))
            end, load_s = updates(unix, args.rows, args.txn_rows)
            wal = end - int(psycopg.connect(unix, autocommit=True).execute(
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = %s",
                (recv,)).fetchone()[0])  # type: ignore[index]
            print(f"[{kind}] load: {load_s:.1f} s, {wal / MB:.0f} MB of WAL")
            ref = recvlogical(dsn, recv, end)
            ours_s, peak = our_drain(cfg, dsn, schema, ours, end, work / f"{tag}.log")
            ref_rate, our_rate = args.rows / ref, args.rows / ours_s
            print(f"[{kind}] pg_recvlogical {ref:.2f} s ({ref_rate:,.0f}/s); cdc-pipeline drain {ours_s:.2f} s "
                  f"({our_rate:,.0f}/s, peak RSS {peak / MB:.0f} MB)")
            results.append((kind, f"{ref_rate:,.0f}", f"{our_rate:,.0f}", f"{100 * our_rate / ref_rate:.0f}%",
                            f"{peak / MB:.0f} MB"))
            with psycopg.connect(unix, autocommit=True) as conn:
                for slot in (recv, ours):
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                conn.execute("VACUUM t")

        # Peak RSS through one 1,000,000-row transaction.
        cfg = config(work / "big.yaml", unix, "ours_big", "bench_big", ["public.t2"])
        run_cli(cfg, "setup")
        with psycopg.connect(unix, autocommit=True) as conn:
            conn.execute("INSERT INTO t2 SELECT g, g FROM generate_series(1, %s) g", (args.big_txn_rows,))
        end = current_lsn(unix)
        big_s, big_peak = our_drain(cfg, unix, "bench_big", "ours_big", end, work / "big.log")
        print(f"[1M-row transaction] drained in {big_s:.1f} s ({args.big_txn_rows / big_s:,.0f}/s), "
              f"peak RSS {big_peak / MB:.0f} MB")

        print()
        print(table(results, ("connection", "pg_recvlogical changes/s", "cdc-pipeline drain changes/s",
                              "ratio (target >= 40%)", "drain peak RSS")))
        print(f"\nsingle {args.big_txn_rows:,}-row transaction: drain peak RSS {big_peak / MB:.0f} MB "
              f"(target <= 1024 MB), {args.big_txn_rows / big_s:,.0f} changes/s")
    finally:
        keep_or_destroy(cluster, args.keep)


if __name__ == "__main__":
    main()
