"""`metrics.run_ports_from`: the long-lived Dagster runs serve what `drain --metrics-port` and `deliver
--metrics-port` serve, each on its port of the map (ops/run_ports.py). The drain job and a delivery job run
as real runs, each in its own run worker process, under a small write load: /metrics agrees with `status`
(counters equal to what arrived, monotonic), /healthz and /readyz answer, the run's log says where once, and
a run that ends leaves no server thread and no listening socket. The delivery run starts while its port is
still held (a previous run stopping): it delivers meanwhile and serves once the port is released."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

from cdc_pipeline.admin import status
from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.e2e.test_dagster_dev import Load
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, wait_until
from cdc_pipeline_tests.integration.ops.test_metrics import _get, _scrape

# A run worker: one job executed as a Dagster run until interrupted (SIGTERM, as a terminated run worker);
# then it reports what it left behind.
RUN = """
import json, signal, socket, sys, threading
from dagster import DagsterInstance
from cdc_pipeline.defs import build_definitions
path, job_name, op, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
signal.signal(signal.SIGTERM, signal.default_int_handler)
job = build_definitions(path).resolve_job_def(job_name)
with DagsterInstance.ephemeral() as instance:
    try:
        job.execute_in_process(instance=instance, raise_on_error=False,
                               run_config={"ops": {op: {"config": {"max_seconds": 300}}}})
    except KeyboardInterrupt:
        pass
    [run] = instance.get_runs()
    logs = [e.user_message for e in instance.all_logs(run.run_id)]
# Interrupted while suspended at a yield, the op's generator is left to the garbage collector (its frames
# and the interrupt's traceback form cycles): its `finally`, which stops the metrics server, runs when the
# cycle is collected (a real run worker's process ends here anyway). Collect, then look at what is left.
import gc
gc.collect()
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        bindable = True
    except OSError:
        bindable = False
print("REPORT " + json.dumps({"threads": [t.name for t in threading.enumerate() if t.name.startswith("ops-")],
                              "bindable": bindable, "metrics_logs": [m for m in logs if "metrics" in m]}))
"""


def _free_range(n: int) -> int:
    """The first of ``n`` consecutive free ports."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + n > 65535:
            continue
        socks = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()


def _run(path: Path, job: str, op: str, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", RUN, str(path), job, op, str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _report(proc: subprocess.Popen[str]) -> dict:  # type: ignore[type-arg]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("REPORT ")]
    assert lines, err[-3000:]
    return json.loads(lines[-1][len("REPORT "):])  # type: ignore[no-any-return]


def test_drain_and_delivery_runs_serve_metrics_on_their_ports(source_db, db_factory, write_config,
                                                              tmp_path: Path) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.orders"])
    # Another sink with two lanes first, so the mirror's run is fourth in the map: drain, other 0, other 1, mirror.
    data["sinks"].insert(0, {"name": "other", "tables": ["public.orders"], "lanes": 2,
                             "destination": {"type": "parquet", "path": str(tmp_path / "other")}})
    first = _free_range(4)
    data["metrics"] = {"run_ports_from": first}
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 200) g")
    drain_port, mirror_port = first, first + 3
    # The mirror's port is still held (as by a previous run of its job, stopping): its run must deliver anyway.
    held = socket.socket()
    held.bind(("127.0.0.1", mirror_port))
    held.listen()
    runs = [_run(tmp_path / "cdc.yaml", "cdc_drain", "cdc__change_log", drain_port),
            _run(tmp_path / "cdc.yaml", "deliver_mirror", "sink__mirror", mirror_port)]
    try:
        def up(port: int) -> bool:
            assert all(run.poll() is None for run in runs), [run.communicate()[1][-3000:] for run in runs]
            return _get(port, "/readyz")[0] == 200

        wait_until(lambda: up(drain_port), 180, "the drain run ready on its port")
        wait_until(lambda: status.collect(config)["sinks"]["mirror"]["delivered"] == 200, 180,
                   "the first rows delivered while the run's port is busy")
        held.close()
        wait_until(lambda: up(mirror_port), 30, "the delivery run serving once its port is free")
        assert _get(drain_port, "/healthz") == (200, "ok\n") and _get(mirror_port, "/healthz") == (200, "ok\n")

        delivered = ("cdc_sink_messages_delivered_total", (("sink", "mirror"),))
        logged = ("cdc_changes_logged_total", ())
        seen: list[tuple[float, float]] = []

        def sample() -> None:
            seen.append((_scrape(drain_port)[logged], _scrape(mirror_port)[delivered]))

        load = Load(source_db.dsn, rate=100, seconds=3, first_id=1001)
        wait_until(lambda: sample() or not load.is_alive(), 30, "the load written while scraping")
        assert load.error is None
        total = 200 + load.next_id - 1001
        wait_until(lambda: sample() or seen[-1] == (total, total), 60, "every change logged and delivered")
        for metric in (0, 1):  # counters only grow
            assert all(a[metric] <= b[metric] for a, b in zip(seen, seen[1:], strict=False)), seen
        assert len({s for s in seen if s != (total, total)}) >= 1  # scraped while the load was in flight

        figures = status.collect(config)
        mirror = _scrape(mirror_port)
        assert figures["log"]["messages"] == total == figures["sinks"]["mirror"]["delivered"] == mirror[delivered]
        wait_until(lambda: _scrape(mirror_port)[("cdc_sink_lag_messages", (("sink", "mirror"),))] == 0, 30,
                   "lag 0 as status says")
        assert figures["sinks"]["mirror"]["lag_messages"] == 0
        drained = _scrape(drain_port)
        assert abs(drained[("cdc_slot_lag_bytes", ())] - figures["slot"]["lag_bytes"]) < 1024 * 1024
        assert drained[("cdc_slot_active", ())] == 1
        # The CLI's names and labels: the sink's name (never its lane), the histogram of its batches.
        assert mirror[("cdc_sink_batch_duration_seconds_count", (("sink", "mirror"),))] >= 1
        assert mirror[("cdc_sink_messages_parked_total", (("sink", "mirror"),))] == 0
        assert drained[("cdc_transactions_logged_total", ())] >= 1 and drained[("cdc_drain_retries_total", ())] == 0
        assert (logged[0], ()) not in mirror and delivered not in drained  # each run its own work
    finally:
        held.close()
        reports = [_report(run) if run.poll() is None else {"exited": run.communicate()} for run in runs]
    for report in reports:
        assert report["threads"] == [] and report["bindable"], report
    where = "metrics and health of this run on 127.0.0.1:{0}: http://127.0.0.1:{0}/metrics, /healthz, /readyz"
    assert reports[0]["metrics_logs"] == [where.format(drain_port)]
    # The delivery run said once what it waited for (not per try), then once where it serves.
    waited, bound = reports[1]["metrics_logs"]
    assert waited == (f"metrics port 127.0.0.1:{mirror_port} is in use (the previous run of this job still "
                      "stopping?): serving /metrics, /healthz, /readyz there once it is free")
    assert bound.startswith(where.format(mirror_port) + " (bound after waiting "), bound
    assert assert_mirrored(source_db.dsn, "public.orders", dest.dsn, "mirror.orders") == total
