"""Pull consumer test helpers: `cdc-pipeline serve` as a real process, and a worker process that
receives, records, nacks some, acks the rest, and sometimes dies mid-batch.

Run as a worker: python -m cdc_pipeline_tests.pull CONSUMER_URL TOKEN OUT SEED NACK_RATE KILL_RATE STOP_FILE
Each processed message is one line in OUT: `<monotonic ns> <group> <seq> <key>`, written (and flushed)
before the ack is sent, so lines of different workers order correctly by their CLOCK_MONOTONIC stamps.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

KILLED = 3  # exit status of a worker that killed itself mid-batch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`cdc-pipeline serve` on a free port, as its own process group."""

    def __init__(self, config_path: Path, env: dict[str, str], port: int | None = None) -> None:
        self.config_path = config_path
        self.env = env
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = config_path.parent / f"serve-{self.port}.log"

    def start(self, timeout: float = 30) -> Server:
        out = open(self.log, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cdc_pipeline.cli", "serve", "--config", str(self.config_path),
             "--port", str(self.port)], env={**os.environ, **self.env}, stdout=out, stderr=out,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(self.url + "/openapi.json", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"serve did not answer in {timeout} s: {self.log.read_text()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def worker(url: str, token: str, out_path: str, seed: int, nack_rate: float, kill_rate: float,
           stop_file: str) -> int:
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client, open(out_path, "a") as out:
        while True:
            try:
                r = client.post("/receive", json={"batch_size": 100, "wait_for_ms": 300})
                r.raise_for_status()
                data = r.json()["data"]
            except httpx.HTTPError:
                time.sleep(0.05)  # serve restarting
                continue
            if not data:
                if os.path.exists(stop_file):
                    return 0
                continue
            die = rng.random() < kill_rate
            acks, nacks = [], []
            for i, item in enumerate(data):
                if die and i == len(data) // 2:
                    out.flush()
                    os._exit(KILLED)  # mid-batch: half processed, nothing acked
                if rng.random() < nack_rate:
                    nacks.append(item["ack_id"])
                    continue
                m = item["message"]
                out.write(f"{time.monotonic_ns()} {m['record']['id']} {m['record']['seq']} "
                          f"{m['metadata']['idempotency_key']}\n")
                acks.append(item["ack_id"])
            out.flush()
            try:
                if acks:
                    client.post("/ack", json={"ack_ids": acks}).raise_for_status()
                if nacks:
                    client.post("/nack", json={"ack_ids": nacks}).raise_for_status()
            except httpx.HTTPError:
                pass  # their leases expire and they come back


def spawn_worker(url: str, token: str, out: Path, seed: int, nack_rate: float, kill_rate: float,
                 stop_file: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cdc_pipeline_tests.pull", url, token, str(out), str(seed),
                             str(nack_rate), str(kill_rate), str(stop_file)])


def read_records(paths: list[Path]) -> list[tuple[int, int, int, str]]:
    records = []
    for p in paths:
        if p.exists():
            for line in p.read_text().splitlines():
                ns, group, seq, key = line.split(" ")
                records.append((int(ns), int(group), int(seq), key))
    records.sort()
    return records


def receive(client: httpx.Client, name: str, batch_size: int = 10, wait_for_ms: int = 0) -> list[dict]:
    r = client.post(f"/api/consumers/{name}/receive", json={"batch_size": batch_size, "wait_for_ms": wait_for_ms})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def settle(client: httpx.Client, name: str, ids: list[str], verb: str = "ack") -> dict:
    r = client.post(f"/api/consumers/{name}/{verb}", json={"ack_ids": ids})
    assert r.status_code == 200, r.text
    return dict(r.json())


if __name__ == "__main__":
    url, token, out, seed, nack, kill, stop = sys.argv[1:8]
    sys.exit(worker(url, token, out, int(seed), float(nack), float(kill), stop))
