"""Pull consumers: receive + ack throughput and receive latency through `cdc-pipeline serve`.

    python bench/pull.py                          # 100,000 messages of 1,000 groups, 4 workers, batch 100
    python bench/pull.py --messages 20000 --servers 2 --repeat 2 --wait-quiet 120 [--durable]

A throwaway cluster holds the state database; the queue is filled through the http_pull sink's own
enqueue (what the delivery engine calls), with ~250-byte messages, group = message % groups. Then
`serve` runs as its own process(es) and 4 worker processes each loop: receive (batch_size, long-poll
1 s) -> ack every id, until the queue is empty. Reported: msgs/s over the whole run, and p50/p99 of
receive requests that returned messages, the CPU seconds spent by serve, PostgreSQL and the workers (the
workers share the machine's cores, so their client's cost is part of the figure), and the load average.
Targets: >= 20,000 msgs/s, p99 < 50 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import cpu_busy, machine, start_cluster, wait_quiet  # noqa: E402
from cdc_pipeline.state.pull_queue import PullQueue  # noqa: E402
from cdc_pipeline.state.schema import ensure_schema  # noqa: E402
from cdc_pipeline_tests.pull import Server  # noqa: E402

TOKEN = "bench-token"


def fill(dsn: str, messages: int, groups: int) -> None:
    queue = PullQueue("cdc_pipeline")
    with psycopg.connect(dsn) as conn:
        ensure_schema(conn, "cdc_pipeline")
        rows = []
        for i in range(messages):
            g = i % groups
            payload = json.dumps({"record": {"id": g, "seq": i // groups, "note": "x" * 80}, "changes": None,
                                  "action": "update", "metadata": {"table_schema": "public", "table_name": "t",
                                                                   "commit_lsn": 1000 + i, "commit_idx": 0,
                                                                   "idempotency_key": f"{1000 + i}:0"}})
            rows.append((1000 + i, 0, f"public|t|{g}", payload))
        queue.enqueue(conn, "bench", rows)
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE cdc_pipeline.pull_queue")


def postgres_cpu(data_dir: Path) -> dict[int, float]:
    """CPU seconds (user + system) per process of the bench's cluster (postmaster.pid names it)."""
    postmaster = psutil.Process(int((data_dir / "postmaster.pid").read_text().split()[0]))
    out = {}
    for p in [postmaster, *postmaster.children()]:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


class Client:
    """A keep-alive JSON client: http.client (light on CPU, which the workers share with serve and
    PostgreSQL) or httpx (what the tests use), to see what the client costs."""

    def __init__(self, url: str, kind: str) -> None:
        parts = urlsplit(url)
        self.path = parts.path
        self.headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        self.kind = kind
        if kind == "httpx":
            self.httpx = httpx.Client(base_url=url, headers=self.headers, timeout=30)
        else:
            self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)

    def post(self, verb: str, body: dict) -> Any:
        if self.kind == "httpx":
            return self.httpx.post("/" + verb, json=body).json()
        self.conn.request("POST", f"{self.path}/{verb}", json.dumps(body), self.headers)
        r = self.conn.getresponse()
        data = r.read()
        assert r.status == 200, (r.status, data)
        return json.loads(data)


def work(url: str, batch: int, total: int, client_kind: str, done: Any, out: multiprocessing.Queue) -> None:
    latencies: list[float] = []
    got = 0
    client = Client(url, client_kind)
    while True:
        t0 = time.perf_counter()
        data = client.post("receive", {"batch_size": batch, "wait_for_ms": 1000})["data"]
        elapsed = time.perf_counter() - t0
        if not data:
            if done.value >= total:
                break
            continue
        latencies.append(elapsed)
        r = client.post("ack", {"ack_ids": [d["ack_id"] for d in data]})
        assert not r["stale"], r
        got += len(data)
        with done.get_lock():
            done.value += len(data)
    out.put((got, latencies, time.process_time()))


def run_once(args: argparse.Namespace, run: int) -> None:
    cluster = start_cluster(durable=args.durable)
    servers: list[Server] = []
    try:
        dsn = cluster.dsn()
        t0 = time.perf_counter()
        fill(dsn, args.messages, args.groups)
        print(f"[run {run}] queued {args.messages} messages of {args.groups} groups in "
              f"{time.perf_counter() - t0:.1f} s")
        workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"pull-bench-{os.getpid()}"
        workdir.mkdir(exist_ok=True)
        cfg = workdir / "cdc.yaml"
        cfg.write_text(yaml.safe_dump({
            "source": {"dsn": dsn}, "tables": [{"name": "public.t"}],
            "sinks": [{"name": "bench", "tables": ["public.t"],
                       "destination": {"type": "http_pull", "token_env": "PULL_TOKEN"}}]}))
        servers = [Server(cfg, {"PULL_TOKEN": TOKEN}).start() for _ in range(args.servers)]
        serve_procs = [psutil.Process(s.proc.pid) for s in servers if s.proc is not None]
        busy = wait_quiet(args.wait_quiet) if args.wait_quiet else cpu_busy(0.5)
        load_before = os.getloadavg()[0]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in serve_procs)
        pg0 = postgres_cpu(cluster.data_dir)
        done = multiprocessing.Value("q", 0)
        out: multiprocessing.Queue = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=work, args=(
            f"{servers[i % len(servers)].url}/api/consumers/bench", args.batch, args.messages, args.client,
            done, out)) for i in range(args.workers)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        seconds = time.perf_counter() - t0
        for p in procs:
            p.join()
        serve_cpu = sum(sum(p.cpu_times()[:2]) for p in serve_procs) - cpu0
        pg1 = postgres_cpu(cluster.data_dir)  # processes alive throughout: the pool's backends
        pg_cpu = sum(v - pg0.get(pid, 0.0) for pid, v in pg1.items())
        worker_cpu = sum(r[2] for r in results)
        total = sum(r[0] for r in results)
        lat = sorted(x for r in results for x in r[1])
        assert total == args.messages, f"{total} received and acked of {args.messages}"
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(f"[run {run}] {total} messages received+acked by {args.workers} workers ({args.client}, batch "
              f"{args.batch}, {args.servers} serve process(es)) in {seconds:.1f} s: {total / seconds:,.0f} msgs/s "
              f"(CPUs {100 * busy:.0f}% busy before; load average {load_before:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after)")
        print(f"[run {run}] receive latency with messages ready: p50 {statistics.median(lat) * 1000:.1f} ms, "
              f"p99 {p99 * 1000:.1f} ms over {len(lat)} requests")
        # CPU spent, independent of what else the machine runs: what one core could sustain.
        print(f"[run {run}] CPU: serve {serve_cpu:.1f} s ({total / serve_cpu:,.0f} msgs per serve CPU-second), "
              f"PostgreSQL {pg_cpu:.1f} s ({total / pg_cpu:,.0f} msgs per PostgreSQL CPU-second), "
              f"workers {worker_cpu:.1f} s")
    finally:
        for s in servers:
            s.stop()
        cluster.destroy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--client", choices=["http.client", "httpx"], default="http.client")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--durable", action="store_true", help="fsync and synchronous_commit on (default off)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="before each run, wait up to S seconds for other work to leave the CPUs idle")
    args = ap.parse_args()
    print(machine())
    for run in range(1, args.repeat + 1):
        run_once(args, run)


if __name__ == "__main__":
    main()
