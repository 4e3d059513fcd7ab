"""`--metrics-port` on real `drain` and `deliver` processes under load: /metrics agrees with `status`
(counters monotonic and equal to what arrived, lag as status says), /healthz answers, and /readyz turns
not-ready while the destination is down and ready once it is back."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import conninfo

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.demo.dagster_dev import free_port
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config, wait_until
from cdc_pipeline_tests.integration.delivery.test_delivery_outage import _config as _webhook_config
from cdc_pipeline_tests.integration.sinks.test_sink_webhook import Receiver
from cdc_pipeline_tests.netfaults import TcpProxy
from cdc_pipeline_tests.processes import CLI, spawn, stop


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, text = _get(port, "/metrics")
    assert code == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _status(config: PipelineConfig) -> dict:
    out = subprocess.run([CLI, "--config", str(config.path), "status", "--json"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return json.loads(out)


def test_metrics_agree_with_status_and_readyz_follows_an_outage(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    parts = conninfo.conninfo_to_dict(dest.dsn)
    proxy = TcpProxy(int(parts.get("port") or 5432)).start()
    via_proxy = conninfo.make_conninfo(dest.dsn, host="127.0.0.1", port=str(proxy.port))
    source_db.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v text NOT NULL)")
    config = write_config(mirror_config(source_db.dsn, via_proxy, ["public.t"]))
    setup(config)
    stop_load = threading.Event()
    written = [0]

    def load() -> None:
        with psycopg.connect(source_db.dsn, autocommit=True) as conn:
            while not stop_load.wait(0.01):
                written[0] += 1
                conn.execute("INSERT INTO public.t VALUES (%s, 'x')", (written[0],))

    drain_port, deliver_port = free_port(), free_port()
    drainer = spawn(config.path, "drain", "--metrics-port", str(drain_port))
    deliverer = spawn(config.path, "deliver", "--metrics-port", str(deliver_port))
    loader = threading.Thread(target=load, daemon=True)
    try:
        wait_until(lambda: _get(deliver_port, "/readyz")[0] == 200 and _get(drain_port, "/readyz")[0] == 200, 120,
                   "both processes ready")
        assert _get(drain_port, "/healthz") == (200, "ok\n")
        loader.start()
        delivered = ("cdc_sink_messages_delivered_total", (("sink", "mirror"),))
        logged = ("cdc_changes_logged_total", ())
        wait_until(lambda: _scrape(deliver_port).get(delivered, 0) >= 100, 120, "deliveries under load")
        first, first_drain = _scrape(deliver_port), _scrape(drain_port)
        wait_until(lambda: _scrape(deliver_port)[delivered] > first[delivered], 60, "more deliveries")
        assert _scrape(drain_port)[logged] >= first_drain[logged]  # counters only grow
        # The log rows it read for the sink (a lane's share with lanes): at least what it delivered.
        assert _scrape(deliver_port)[("cdc_sink_rows_read_total", (("sink", "mirror"),))] >= first[delivered]

        # The destination goes down: deliver waits on it, and says so on /readyz.
        proxy.stop()
        wait_until(lambda: _get(deliver_port, "/readyz")[0] == 503, 120, "/readyz not ready during the outage")
        code, body = _get(deliver_port, "/readyz")
        assert "sink mirror waiting" in body, body
        lag_seconds = ("cdc_sink_lag_seconds", (("sink", "mirror"),))
        wait_until(lambda: _scrape(deliver_port)[lag_seconds] > 0.5, 60, "the sink's lag in seconds grows")
        assert _get(deliver_port, "/healthz")[0] == 200  # alive, only not ready
        assert _scrape(deliver_port)[("cdc_sink_outage_retries_total", (("sink", "mirror"),))] >= 1
        proxy.start()
        wait_until(lambda: _get(deliver_port, "/readyz")[0] == 200, 120, "/readyz ready after the outage")

        stop_load.set()
        loader.join()
        total = written[0]
        wait_until(lambda: _scrape(deliver_port)[delivered] == total, 120, "every change delivered")
        status = _status(config)
        metrics, drain_metrics = _scrape(deliver_port), _scrape(drain_port)
        assert drain_metrics[logged] == total == status["log"]["messages"]
        assert metrics[delivered] == status["sinks"]["mirror"]["delivered"] == total
        wait_until(lambda: _scrape(deliver_port)[("cdc_sink_lag_messages", (("sink", "mirror"),))] == 0, 30,
                   "lag 0 as status says")
        assert status["sinks"]["mirror"]["lag_messages"] == 0
        assert status["sinks"]["mirror"]["lag_seconds"] == 0.0 == _scrape(deliver_port)[lag_seconds]
        assert abs(drain_metrics[("cdc_slot_lag_bytes", ())] - status["slot"]["lag_bytes"]) < 1024 * 1024
        assert metrics[("cdc_sink_batch_duration_seconds_count", (("sink", "mirror"),))] >= 1
        assert stop(deliverer, 15, 60)[0] == 0 and stop(drainer, 15, 60)[0] == 0
    finally:
        stop_load.set()
        proxy.stop()
        for proc in (drainer, deliverer):
            if proc.poll() is None:
                proc.kill()
                print(proc.communicate()[1][-3000:])


def test_webhook_request_metrics_count_every_request_and_nothing_stays_in_flight(
        source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    receiver = Receiver()
    config = _webhook_config(source_db, write_config, receiver.url, destination={"batch_size": 5})
    source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 200) g")
    port = free_port()
    drainer = spawn(config.path, "drain")
    deliverer = spawn(config.path, "deliver", "--metrics-port", str(port))
    try:
        delivered = ("cdc_sink_messages_delivered_total", (("sink", "hook"),))
        wait_until(lambda: _get(port, "/readyz")[0] == 200 and _scrape(port).get(delivered) == 200, 120,
                   "200 messages delivered")
        metrics = _scrape(port)
        requests = len(receiver.requests)
        assert requests == 40  # 200 messages in requests of 5
        assert metrics[("cdc_sink_request_duration_seconds_count", (("sink", "hook"),))] == requests
        assert metrics[("cdc_sink_request_duration_seconds_sum", (("sink", "hook"),))] > 0
        assert metrics[("cdc_sink_requests_in_flight", (("sink", "hook"),))] == 0
        assert stop(deliverer, 15, 60)[0] == 0 and stop(drainer, 15, 60)[0] == 0
    finally:
        receiver.stop()
        for proc in (drainer, deliverer):
            if proc.poll() is None:
                proc.kill()
