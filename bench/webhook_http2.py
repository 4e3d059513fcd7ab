"""The webhook over TLS: HTTP/2 (one connection, concurrent streams) against HTTP/1.1 (a connection per
request in flight), same endpoint, same window (issue 23).

    .venv/bin/python bench/webhook_http2.py                          # 3,000 groups x 3 versions, 20 ms
    .venv/bin/python bench/webhook_http2.py --chunks 1,10 --rounds 2

The endpoint is hypercorn (an ASGI server that speaks both, TLS with a throwaway CA from trustme) in its
own process, answering each request `--latency-ms` after its body arrived. The sink is driven directly
(one `deliver()` of all the messages, no cluster): msgs/s, connections the endpoint saw, peak requests in
flight. `http2` on and off alternate, `--rounds` times. hypercorn is pure Python too, so on 2 shared cores
the endpoint's CPU is part of what is measured: compare the two protocols with each other, not with the
plain asyncio receiver of bench/webhook_parallel.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import cpu_busy, machine, table  # noqa: E402 - runnable as a script


def _serve(latency: float, cert: str, key: str, port_out: Any) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    state: dict[str, Any] = {"in_flight": 0, "peak": 0, "requests": 0, "clients": set(), "versions": set()}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/stats":
            out = json.dumps({"peak": state["peak"], "requests": state["requests"],
                              "connections": len(state["clients"]), "versions": sorted(state["versions"])})
        elif scope["path"] == "/reset":
            state.update(in_flight=0, peak=0, requests=0, clients=set(), versions=set())
            out = "{}"
        else:
            state["in_flight"] += 1
            state["requests"] += 1
            state["peak"] = max(state["peak"], state["in_flight"])
            state["clients"].add(scope["client"][1])
            state["versions"].add(scope["http_version"])
            await asyncio.sleep(latency)
            state["in_flight"] -= 1
            out = "{}"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out.encode()})

    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.certfile, config.keyfile = cert, key
    config.loglevel = "WARNING"
    # hypercorn's default (1,000) ends an HTTP/2 connection with requests still in flight: they fail unanswered
    # (and are sent again by the engine); an endpoint that drains after its GOAWAY loses none.
    config.keep_alive_max_requests = 10**9
    port_out.put(sock.getsockname()[1])
    asyncio.run(serve(app, config))  # type: ignore[arg-type]


def _call(base: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + path, timeout=30) as resp:  # noqa: S310 - our own endpoint
        return json.loads(resp.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency-ms", type=float, default=20)
    ap.add_argument("--groups", type=int, default=3000)
    ap.add_argument("--chunks", default="1,10", help="webhook batch_size values, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import trustme

    from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
    from cdc_pipeline.sinks import build_sink
    from cdc_pipeline.sinks.base import OutboundMessage
    from cdc_pipeline.sinks.webhook import MAX_IN_FLIGHT, WebhookDestination

    print(machine())
    print(f"{args.groups:,} groups x 3 versions, endpoint latency {args.latency_ms:g} ms, TLS, hypercorn")
    work = Path(tempfile.mkdtemp(prefix="cdc_bench_h2_"))
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(work / "chain.pem"))
    cert.private_key_pem.write_to_path(str(work / "key.pem"))
    ca.cert_pem.write_to_path(str(work / "ca.pem"))
    os.environ["SSL_CERT_FILE"] = str(work / "ca.pem")  # the sink trusts the throwaway CA
    ctx = multiprocessing.get_context("spawn")
    port_out = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(args.latency_ms / 1000, str(work / "chain.pem"), str(work / "key.pem"),
                                            port_out), daemon=True)
    proc.start()
    base = f"https://localhost:{port_out.get(timeout=60)}"
    import ssl

    urllib.request.install_opener(urllib.request.build_opener(urllib.request.HTTPSHandler(
        context=ssl.create_default_context(cafile=str(work / "ca.pem")))))
    n = 3 * args.groups
    msgs = [OutboundMessage(key=f"{1000 + i}:{i}", group=f"g{i % args.groups}", route=None,
                            payload=json.dumps({"record": {"id": i % args.groups, "ver": i // args.groups},
                                                "metadata": {"idempotency_key": f"{1000 + i}:{i}"}}).encode())
            for i in range(n)]
    rows: list[tuple[str, ...]] = []
    try:
        for _ in range(args.rounds):
            for chunk in [int(c) for c in args.chunks.split(",")]:
                for http2 in (True, False):
                    dest = WebhookDestination(url=f"{base}/hook", batch_size=chunk, http2=http2)
                    sink = build_sink(SimpleNamespace(name="bench", destination=dest), environ={})
                    _call(base, "/reset")
                    busy = cpu_busy(1.0)
                    with sink:
                        t0 = time.perf_counter()
                        results = deliver_in_order(sink, msgs)
                        seconds = time.perf_counter() - t0
                    s = _call(base, "/stats")
                    limit = MAX_IN_FLIGHT * chunk / (args.latency_ms / 1000)
                    ok = all(r is None for r in results) and s["requests"] == -(-n // chunk)
                    rows.append((f"batch_size {chunk}, http2 {'on' if http2 else 'off'}", f"{n / seconds:,.0f}",
                                 "/".join(s["versions"]), str(s["connections"]), str(s["peak"]), f"{limit:,.0f}",
                                 f"{busy:.0%}", "ok" if ok else f"FAIL {s}"))
                    print(rows[-1], flush=True)
    finally:
        proc.terminate()
        proc.join(5)
    print(table(rows, ("run", "msgs/s", "HTTP", "connections", "peak in flight", "physical limit",
                       "CPU busy before", "check")))


if __name__ == "__main__":
    main()
