"""Start and stop `dagster dev` on the project's workspace (used by `demo`, the e2e tests and
`bench/e2e.py --dagster`), and talk to it over GraphQL.

`dagster dev` inherits ignored SIGINT/SIGTERM from a parent that ignores them, so the child gets default
signal handling back, runs in its own process group, and is stopped by that group's id.

What a newcomer would otherwise see at its start, and why it does not apply:
- "Found a dagster instance configuration value (dagster.yaml) in the current folder ... will not be
  used": `dagster dev` warns when started beside a dagster.yaml that is not $DAGSTER_HOME's. It runs in
  $DAGSTER_HOME (which holds a copy of the project's dagster.yaml), with the checkout on PYTHONPATH.
- "Function `dev_command` is superseded ... Use 'dg dev' instead": `dg dev` serves a `dg` project; this
  checkout is a plain workspace (workspace.yaml), which `dagster dev` serves as before. The notice is
  filtered in the child (a `-W` option, for that message only).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from psycopg import conninfo

PROJECT = Path(__file__).resolve().parents[2]  # the checkout: workspace.yaml, dagster.yaml
LOCATION = "cdc_pipeline"
DEV_NOTICE = "ignore:Function `dev_command` is superseded"  # see the module's doc


def storage_url(dsn: str) -> str:
    """A psycopg2 SQLAlchemy URL for Dagster's storage from a libpq DSN (SQLAlchemy 2.1 maps a plain
    postgresql:// URL to psycopg 3, which breaks dagster-postgres' LISTEN/NOTIFY)."""
    parts = conninfo.conninfo_to_dict(dsn)
    user = parts.get("user") or os.environ.get("USER", "postgres")
    host = parts.get("host") or "localhost"
    query = f"?host={host}&port={parts.get('port') or 5432}"
    if parts.get("password"):
        query += f"&password={parts['password']}"
    return f"postgresql+psycopg2://{user}@/{parts.get('dbname') or user}{query}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class DagsterDev:
    def __init__(self, home: Path, config_path: Path, storage_dsn: str, port: int | None = None,
                 log: IO[bytes] | int | None = subprocess.DEVNULL) -> None:
        self.home, self.config_path, self.port = home, config_path, port or free_port()
        path = os.pathsep.join(p for p in (str(PROJECT), os.environ.get("PYTHONPATH", "")) if p)
        self.env = dict(os.environ, DAGSTER_HOME=str(home), CDC_CONFIG=str(config_path),
                        DAGSTER_PG_URL=storage_url(storage_dsn), PYTHONPATH=path)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DagsterDev:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "dagster.yaml").write_text((PROJECT / "dagster.yaml").read_text())
        self.proc = subprocess.Popen(
            [sys.executable, "-W", DEV_NOTICE, "-m", "dagster", "dev", "-w", str(PROJECT / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(self.port)], cwd=self.home, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_default_signals)
        return self

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def wait_loaded(self, timeout: float = 180, cancel: Callable[[], bool] = lambda: False) -> dict[str, list[str]]:
        """Waits until the code location is loaded; returns its sensor and job names (none if `cancel()`
        turned true first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cancel():
                return {"sensors": [], "jobs": []}
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited with {self.proc.returncode}")
            try:
                data = self.graphql("{ repositoriesOrError { ... on RepositoryConnection { nodes { "
                                    "sensors { name } jobs { name } } } } }")
                nodes = data["data"]["repositoriesOrError"]["nodes"]
                if nodes:
                    return {"sensors": [s["name"] for n in nodes for s in n["sensors"]],
                            "jobs": [j["name"] for n in nodes for j in n["jobs"]]}
            except (OSError, KeyError, TypeError):
                pass
            time.sleep(1)
        raise TimeoutError("dagster dev did not load the code location")

    def terminate_run(self, run_id: str) -> dict[str, Any]:
        """What the UI's Terminate button sends."""
        return self.graphql(
            "mutation($runId: String!) { terminateRun(runId: $runId) { __typename "
            "... on PythonError { message } ... on UnauthorizedError { message } } }", {"runId": run_id})

    def sensor_ticks(self, sensor: str, limit: int = 200) -> list[dict[str, Any]]:
        data = self.graphql(
            "query($s: SensorSelector!, $n: Int) { sensorOrError(sensorSelector: $s) { ... on Sensor { "
            "sensorState { ticks(limit: $n) { status timestamp endTimestamp } } } } }",
            {"s": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": sensor},
             "n": limit})
        return data["data"]["sensorOrError"]["sensorState"]["ticks"]  # type: ignore[no-any-return]

    def _sensor_selector(self, sensor: str) -> dict[str, str]:
        return {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": sensor}

    def stop_sensor(self, sensor: str) -> None:
        """What the sensor's toggle sends (stopSensor with its state's id)."""
        data = self.graphql("query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { ... on Sensor { "
                            "sensorState { id } } } }", {"s": self._sensor_selector(sensor)})
        state = (data.get("data") or {}).get("sensorOrError", {}).get("sensorState")
        if state:
            self.graphql("mutation($id: String) { stopSensor(id: $id) { __typename } }", {"id": state["id"]})

    def reset_sensor(self, sensor: str) -> None:
        """Back to its status in code (running, for ours): undoes a stop_sensor of an earlier demo."""
        self.graphql("mutation($s: SensorSelector!) { resetSensor(sensorSelector: $s) { __typename } }",
                     {"s": self._sensor_selector(sensor)})

    def active_runs(self) -> list[str]:
        data = self.graphql('{ runsOrError(filter: {statuses: [QUEUED, NOT_STARTED, STARTING, STARTED, '
                            'CANCELING]}) { ... on Runs { results { runId } } } }')
        return [r["runId"] for r in ((data.get("data") or {}).get("runsOrError") or {}).get("results", [])]

    def cancel_runs(self, sensors: list[str], timeout: float = 90.0) -> dict[str, str]:
        """Stop the sensors, terminate every active run as the UI's Terminate does, and wait until none is
        active: the runs end Canceled (the streams commit their batch first), not Failure as a killed run
        worker would. Returns each terminated run's job and final status ('<job> <STATUS>' by run id)."""
        for sensor in sensors:
            self.stop_sensor(sensor)
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while True:
            active = self.active_runs()
            seen.update(active)
            if not active or time.monotonic() > deadline:
                break
            self.graphql("mutation($ids: [String!]!) { terminateRuns(runIds: $ids) { __typename } }",
                         {"ids": active})
            time.sleep(1)
        data = self.graphql("query($ids: [String!]) { runsOrError(filter: {runIds: $ids}) { ... on Runs { "
                            "results { runId jobName status } } } }", {"ids": sorted(seen)})
        runs = ((data.get("data") or {}).get("runsOrError") or {}).get("results", [])
        return {r["runId"]: f"{r['jobName']} {r['status']}" for r in runs}

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        # What `dagster dev` started in its group (run workers finishing their batch, a code server it lost
        # track of) gets a little time to exit on the SIGTERM, then is killed.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def __enter__(self) -> DagsterDev:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
