"""Webhook delivery against an endpoint that takes its time: msgs/s and requests in flight (issue 23).

    .venv/bin/python bench/webhook_parallel.py                      # 3,000 groups x 3 versions, 20 ms
    .venv/bin/python bench/webhook_parallel.py --latency-ms 20 --groups 3000 --chunks 1,10 --ungrouped
    .venv/bin/python bench/webhook_parallel.py --sink-only          # the sink alone, no cluster, no CLI
    .venv/bin/python bench/webhook_parallel.py --sink-batch         # batch_size on the sink: a call per message

The receiver is an asyncio HTTP/1.1 server in its own process: each request is answered `--latency-ms`
after its body arrived. It counts requests in flight (peak), and checks every group's versions arrived
in commit order and that no message is missing. The physical limit is `max_in_flight x batch_size /
latency`: what the window allows if every request took exactly the latency.

Default (end to end): a throwaway durable cluster; a table of `--groups` rows, each inserted then
updated twice (three transactions of `--groups` rows); `drain --until-idle`; then, per webhook
`batch_size`, `cdc-pipeline deliver --sink hook --until-idle` is timed as a process, start-up included
(a fresh sink each time: it delivers the whole log). Also printed: the start-up alone (a deliver that
finds nothing to do) and how busy the CPUs were before each run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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

# -- the receiver ------------------------------------------------------------------------------


def _serve(latency: float, port_out: Any) -> None:
    state: dict[str, Any] = {"in_flight": 0, "peak": 0, "requests": 0, "messages": 0, "keys": set(),
                             "last": {}, "backwards": 0, "first_at": None, "last_at": None}

    def account(body: bytes) -> None:
        for m in json.loads(body)["data"]:
            state["messages"] += 1
            state["keys"].add(m["metadata"]["idempotency_key"])
            record = m.get("record") or {}
            gid, ver = record.get("id"), record.get("ver", 0)
            if gid is not None:  # a group going backwards is a reorder (a duplicate repeats the same version)
                if ver < state["last"].get(gid, -1):
                    state["backwards"] += 1
                state["last"][gid] = max(ver, state["last"].get(gid, -1))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
                if head.startswith(b"GET /stats"):
                    out = json.dumps({k: v for k, v in state.items() if k not in ("keys", "last")}
                                     | {"distinct": len(state["keys"]), "groups": len(state["last"])}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(out), out))
                    await writer.drain()
                    continue
                if head.startswith(b"POST /reset"):
                    state.update(in_flight=0, peak=0, requests=0, messages=0, keys=set(), last={}, backwards=0,
                                 first_at=None, last_at=None)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                state["in_flight"] += 1
                state["requests"] += 1
                state["peak"] = max(state["peak"], state["in_flight"])
                state["first_at"] = state["first_at"] or time.time()
                try:
                    await asyncio.sleep(latency)
                    account(body)  # acknowledged: counted (a request cut off before this is not)
                finally:
                    state["in_flight"] -= 1
                state["last_at"] = time.time()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=64 * 1024 * 1024, backlog=1024)
        port_out.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


@contextmanager
def receiver(latency: float) -> Iterator[str]:
    ctx = multiprocessing.get_context("spawn")
    port_out = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(latency, port_out), daemon=True)
    proc.start()
    try:
        yield f"http://127.0.0.1:{port_out.get(timeout=30)}"
    finally:
        proc.terminate()
        proc.join(5)


def _call(base: str, method: str, path: str) -> dict[str, Any]:
    req = urllib.request.Request(base + path, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    return json.loads(body) if body else {}


# -- end to end through the CLI ----------------------------------------------------------------

def load_source(dsn: str, groups: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 0, 'v' FROM generate_series(1, %s) g", (groups,))
        conn.execute("UPDATE items SET ver = 1")
        conn.execute("UPDATE items SET ver = 2")


def end_to_end(args: argparse.Namespace, base: str) -> list[tuple[str, ...]]:
    cluster = start_cluster(durable=True)
    work = Path(tempfile.mkdtemp(prefix="cdc_bench_webhook_"))
    rows: list[tuple[str, ...]] = []
    try:
        cluster.create_database("src")
        src = cluster.dsn("src")
        sinks = []
        modes = [("grouped", True), *([("ungrouped", False)] if args.ungrouped else [])]
        for chunk in args.chunks:
            for label, grouped in modes:
                for lanes in args.lanes:
                    dest: dict[str, Any] = {"type": "webhook", "url": f"{base}/hook"}
                    if args.max_in_flight:
                        dest["max_in_flight"] = args.max_in_flight
                    sink = {"name": f"hook_{label}_{chunk}" + (f"_lanes{lanes}" if lanes > 1 else ""),
                            "tables": ["public.items"], "message_grouping": grouped, "lanes": lanes,
                            "destination": dest}
                    # The sink's own batch_size (Sequin's place for it: a request of that many messages) or the
                    # webhook's (its deprecated alias, the same since the one scheduler; before, messages per
                    # request within a call of the sink's).
                    (sink if args.sink_batch else dest)["batch_size"] = chunk
                    sinks.append(sink)
        cfg = write_config(work / "cdc.yaml", {
            "source": {"dsn": src, "slot": "bench", "publication": "bench"},
            "tables": [{"name": "public.items"}], "sinks": sinks})
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, ver int NOT NULL, note text NOT NULL)")
        run_cli(cfg, "setup")
        load_source(src, args.groups)
        run_cli(cfg, "drain", "--until-idle")
        total = 3 * args.groups
        for sink in sinks:
            chunk = sink.get("batch_size") or sink["destination"]["batch_size"]
            busy = wait_quiet(args.wait_quiet) if args.wait_quiet else cpu_busy(1.0)
            _call(base, "POST", "/reset")
            t0 = time.monotonic()  # one process per lane, as lanes are run
            procs = [subprocess.Popen([CLI, "--config", str(cfg), "deliver", "--sink", sink["name"], "--lane", str(i),
                                       "--until-idle"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for i in range(sink["lanes"])]
            outputs = [p.communicate() for p in procs]
            seconds = time.monotonic() - t0
            if any(p.returncode != 0 for p in procs):
                raise SystemExit(f"deliver failed:\n{outputs}")
            s = _call(base, "GET", "/stats")
            t1 = time.monotonic()  # start-up alone: the same sink again, nothing left to deliver
            subprocess.run([CLI, "--config", str(cfg), "deliver", "--sink", sink["name"], "--lane", "0",
                            "--until-idle"], capture_output=True, check=True)
            startup = time.monotonic() - t1
            # Ungrouped messages (message_grouping: false) carry no order: only completeness is checked.
            ok = s["distinct"] == total and (s["backwards"] == 0 or not sink["message_grouping"])
            window = (s["last_at"] - s["first_at"]) if s["first_at"] else 0.0
            limit = sink["lanes"] * args.max_in_flight_shown * chunk / (args.latency_ms / 1000)
            rows.append((sink["name"], f"{total / seconds:,.0f}", f"{s['distinct'] / window:,.0f}" if window else "-",
                         f"{seconds:.2f}", f"{startup:.2f}", str(s["requests"]), str(s["peak"]), f"{limit:,.0f}",
                         f"{busy:.0%}", "ok" if ok else f"FAIL {s}"))
            print(rows[-1], flush=True)
    finally:
        keep_or_destroy(cluster, args.keep)
    return rows


# -- the sink alone ----------------------------------------------------------------------------

def sink_only(args: argparse.Namespace, base: str) -> list[tuple[str, ...]]:
    from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
    from cdc_pipeline.sinks import build_sink
    from cdc_pipeline.sinks.base import OutboundMessage
    from cdc_pipeline.sinks.webhook import WebhookDestination

    n = 3 * args.groups
    rows: list[tuple[str, ...]] = []
    for chunk in args.chunks:
        for grouped in [True, *([False] if args.ungrouped else [])]:
            msgs = [OutboundMessage(key=f"{1000 + i}:{i}", group=f"g{i % args.groups}" if grouped else None,
                                    route=None, payload=json.dumps({"record": {"id": i % args.groups,
                                    "ver": i // args.groups}, "metadata": {"idempotency_key": f"{1000 + i}:{i}"}}
                                    ).encode()) for i in range(n)]
            extra = {"max_in_flight": args.max_in_flight} if args.max_in_flight else {}
            dest = WebhookDestination(url=f"{base}/hook", **extra)
            sink = build_sink(SimpleNamespace(name="bench", destination=dest), environ={})
            limits = sink.limits()._replace(batch_size=chunk, **extra)
            _call(base, "POST", "/reset")
            busy = cpu_busy(1.0)
            with sink:
                t0 = time.perf_counter()
                results = deliver_in_order(sink, msgs, limits=limits)
                seconds = time.perf_counter() - t0
            s = _call(base, "GET", "/stats")
            ok = all(r is None for r in results) and s["distinct"] == n and (s["backwards"] == 0 or not grouped)
            limit = args.max_in_flight_shown * chunk / (args.latency_ms / 1000)
            rows.append((f"sink {'grouped' if grouped else 'ungrouped'} {chunk}", f"{n / seconds:,.0f}", "-",
                         f"{seconds:.2f}", "-", str(s["requests"]), str(s["peak"]), f"{limit:,.0f}", f"{busy:.0%}",
                         "ok" if ok else f"FAIL {s}"))
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency-ms", type=float, default=20)
    ap.add_argument("--groups", type=int, default=3000)
    ap.add_argument("--chunks", default="1,10", help="webhook batch_size values, comma-separated")
    ap.add_argument("--max-in-flight", type=int, default=None, help="the sink's max_in_flight (default: its own)")
    ap.add_argument("--ungrouped", action="store_true", help="also message_grouping: false")
    ap.add_argument("--sink-batch", action="store_true",
                    help="set batch_size on the sink (calls of that many messages) instead of the webhook destination")
    ap.add_argument("--lanes", default="1", help="sink `lanes` values, comma-separated (one process per lane)")
    ap.add_argument("--sink-only", action="store_true", help="drive the sink directly (no cluster, no CLI)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="before each timed run, wait up to S seconds for other work to leave the CPUs idle")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    args.chunks = [int(c) for c in args.chunks.split(",")]
    args.lanes = [int(n) for n in args.lanes.split(",")]
    try:
        from cdc_pipeline.sinks.webhook import MAX_IN_FLIGHT  # type: ignore[attr-defined]
    except ImportError:
        MAX_IN_FLIGHT = 4  # noqa: N806 - before issue 23: waves of 4 chunks
    args.max_in_flight_shown = args.max_in_flight or MAX_IN_FLIGHT
    print(machine())
    print(f"{args.groups:,} groups x 3 versions, endpoint latency {args.latency_ms:g} ms")
    with receiver(args.latency_ms / 1000) as base:
        rows = sink_only(args, base) if args.sink_only else end_to_end(args, base)
    print(table(rows, ("run", "msgs/s (process)", "msgs/s (sending)", "seconds", "start-up s", "requests",
                       "peak in flight", "physical limit", "CPU busy before", "check")))


if __name__ == "__main__":
    main()
