"""`--metrics-port` on real `serve`, `api-sync` and `backfill` processes: the figures scraped from /metrics
are what happened (messages received/acked/nacked and the pull queue's depth; API requests as the API
counted them, records written, the budget; backfill pages and rows as `backfill list` records them), and
/readyz follows what each needs (serve: its state database; api-sync: the API answering)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import yaml
from psycopg import conninfo

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.demo.dagster_dev import free_port
from cdc_pipeline.state.schema import ensure_schema
from cdc_pipeline_tests.api_fakes import T0, FakeApi
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config, wait_until
from cdc_pipeline_tests.integration.api_sync.test_api_sync import api_config, rest_source
from cdc_pipeline_tests.integration.consumers.test_pull_api import TOKEN, enqueue, pull_config
from cdc_pipeline_tests.integration.ops.test_metrics import _get, _scrape
from cdc_pipeline_tests.netfaults import TcpProxy
from cdc_pipeline_tests.processes import CLI, spawn, stop
from cdc_pipeline_tests.pull import receive, settle


def _metric(port: int, name: str, **labels: str) -> float | None:
    return _scrape(port).get((name, tuple(sorted(labels.items()))))


def _once_up(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scrape, empty while the port does not answer yet (the command still starting)."""
    return _scrape(port) if _get(port, "/healthz")[0] == 200 else {}


def _proxied(dsn: str) -> tuple[TcpProxy, str]:
    proxy = TcpProxy(int(conninfo.conninfo_to_dict(dsn).get("port") or 5432)).start()
    return proxy, conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))


def _kill(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            print(proc.communicate()[1][-3000:])


def test_serve_metrics_count_the_pull_traffic_and_readyz_follows_the_state_database(
        source_db: Database, tmp_path: Path) -> None:
    proxy, via_proxy = _proxied(source_db.dsn)  # the state database is the source's, behind the proxy
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(pull_config(via_proxy)))
    config = load_config(path)
    with psycopg.connect(config.state_dsn) as conn:
        ensure_schema(conn, config.state.schema_name)
    enqueue(config, [(None, i) for i in range(30)])  # ungrouped: all available at once
    port, metrics_port = free_port(), free_port()
    proc = spawn(str(path), "serve", "--port", str(port), "--metrics-port", str(metrics_port),
                 env={"PULL_TOKEN": TOKEN})
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=30)
    try:
        wait_until(lambda: proc.poll() is not None or _get(metrics_port, "/readyz")[0] == 200, 60, "serve ready")
        assert _get(metrics_port, "/healthz") == (200, "ok\n")
        wait_until(lambda: _metric(metrics_port, "cdc_pull_queue_messages", sink="orders", state="waiting") == 30,
                   30, "queue depth 30 waiting")

        got = receive(http, "orders", batch_size=12)
        assert len(got) == 12
        assert settle(http, "orders", [m["ack_id"] for m in got[:8]])["settled"] == 8
        assert settle(http, "orders", [m["ack_id"] for m in got[8:]], "nack")["settled"] == 4
        assert len(receive(http, "orders", batch_size=100)) == 22  # the 18 never handed out and the 4 released
        assert receive(http, "orders", batch_size=5, wait_for_ms=300) == []  # empty after a long-poll
        m = _scrape(metrics_port)
        count = {op: m[("cdc_pull_messages_total", (("operation", op), ("sink", "orders")))]
                 for op in ("received", "acked", "nacked")}
        assert count == {"received": 34, "acked": 8, "nacked": 4}
        hist = "cdc_pull_receive_duration_seconds_count"
        assert m[(hist, (("result", "messages"), ("sink", "orders")))] == 2
        assert m[(hist, (("result", "empty"), ("sink", "orders")))] == 1
        assert m[("cdc_pull_receive_duration_seconds_sum", (("result", "empty"), ("sink", "orders")))] >= 0.3
        wait_until(lambda: _metric(metrics_port, "cdc_pull_queue_messages", sink="orders", state="in_flight") == 22
                   and _metric(metrics_port, "cdc_pull_queue_messages", sink="orders", state="waiting") == 0,
                   30, "queue depth: 22 in flight, none waiting")

        # The state database unreachable: alive, not ready, and why; ready again once it is back.
        proxy.stop()
        wait_until(lambda: _get(metrics_port, "/readyz")[0] == 503, 30, "/readyz not ready without the state db")
        assert "state database" in _get(metrics_port, "/readyz")[1]
        assert _get(metrics_port, "/healthz")[0] == 200
        proxy.start()
        wait_until(lambda: _get(metrics_port, "/readyz")[0] == 200, 30, "/readyz ready again")
        assert stop(proc, 15, 30)[0] == 0
    finally:
        http.close()
        proxy.stop()
        _kill(proc)


def test_api_sync_metrics_agree_with_the_api_and_readyz_follows_an_outage(source_db: Database,
                                                                          tmp_path: Path) -> None:
    with FakeApi("rest") as api:
        for i in range(100):
            api.put("tickets", f"t{i:03d}", at=T0.replace(minute=i // 20), subject=f"s{i}")
        proxy = TcpProxy(int(api.url.rsplit(":", 1)[1])).start()  # the API, behind a proxy that can fail
        source = rest_source(api, [{"name": "tickets", "table": "support.tickets", "id_field": "id",
                                    "cursor_field": "updated_at", "fields": {"subject": "text"}, "page_size": 20}],
                             delete_check_seconds=3600, max_retries=2)
        source["base_url"] = f"http://127.0.0.1:{proxy.port}"
        source["rate_limit"] = {"requests": 20, "per_seconds": 2, "share": 0.5}  # 10 per 2 s window
        path = tmp_path / "cdc.yaml"
        path.write_text(yaml.safe_dump(api_config(source_db.dsn, source)))
        port = free_port()
        proc = spawn(str(path), "api-sync", "--metrics-port", str(port), env={"REST_TOKEN": api.bearer})
        labels = (("source", "tickets"),)
        coll = (("collection", "tickets"), ("source", "tickets"))
        try:
            written = ("cdc_api_records_written_total", labels)
            wait_until(lambda: proc.poll() is not None or _once_up(port).get(written) == 100, 60,
                       "the backfill's 100 records")
            assert _get(port, "/readyz") == (200, "ok\n")
            # Every request the API saw, counted (compared between two turns: a turn adds its own at its end).
            requests = ("cdc_api_requests_total", labels)
            wait_until(lambda: _scrape(port)[requests] == len(api.data_log()), 30, "requests as the API counted")
            # The budget's figures are status's (refreshed every 2 s: at first, before the sync's tables existed).
            wait_until(lambda: ("cdc_api_request_budget", labels) in _scrape(port), 30, "budget figures")
            m = _scrape(port)
            assert m[("cdc_api_request_budget", labels)] == 10
            assert 1 <= m[("cdc_api_requests_in_window", labels)] <= 10
            assert m[("cdc_api_backfill_records", coll)] == 100
            assert m[("cdc_api_failures_total", labels)] == 0
            wait_until(lambda: _scrape(port).get(("cdc_api_backfilling", coll)) == 0, 30, "in sync")
            wait_until(lambda: 0 <= _scrape(port).get(("cdc_api_lag_seconds", coll), -1) < 10, 30, "lag figure")

            # The API unreachable: requests retried, then the collection cools down: not ready, with why.
            proxy.stop()
            wait_until(lambda: _get(port, "/readyz")[0] == 503, 60, "/readyz not ready during the outage")
            assert "api source tickets" in _get(port, "/readyz")[1]
            assert _get(port, "/healthz")[0] == 200
            wait_until(lambda: _scrape(port)[("cdc_api_failures_total", labels)] >= 1, 60, "a failed turn counted")
            proxy.start()
            wait_until(lambda: _get(port, "/readyz")[0] == 200, 90, "/readyz ready once the API answers")
            assert stop(proc, 15, 30)[0] == 0
        finally:
            proxy.stop()
            _kill(proc)


def _backfills(config: PipelineConfig) -> list[dict]:
    out = subprocess.run([CLI, "--config", str(config.path), "backfill", "list", "--json"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_backfill_metrics_count_pages_and_rows_per_table(source_db: Database, db_factory: Callable[[], Database],
                                                         write_config: Callable[..., PipelineConfig]) -> None:
    """Staged with no drain (pages wait), paused, reconciled by a drain started then: the scraped pages and
    rows are `backfill list`'s; resumed, it completes."""
    dest = db_factory()
    source_db.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v text NOT NULL)")
    source_db.execute("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, 1000) g")
    config = write_config({**mirror_config(source_db.dsn, dest.dsn, ["public.t"]),
                           "backfill": {"initial_page_size": 100, "max_page_size": 100, "max_staged_pages": 2}})
    setup(config)
    port = free_port()
    proc = spawn(str(config.path), "backfill", "public.t", "--metrics-port", str(port), "--quiet")
    drainer = None
    table = (("table", "public.t"),)
    try:
        wait_until(lambda: proc.poll() is not None or bool(_backfills(config))
                   and _backfills(config)[0]["pages_in_flight"] >= 2, 60, "pages staged, waiting for a drain")
        wait_until(lambda: _once_up(port).get(("cdc_backfill_pages_staged_total", table)) ==
                   _backfills(config)[0]["pages_in_flight"], 30, "staged pages as recorded")
        assert _scrape(port)[("cdc_backfill_pages_total", table)] == 0
        info = _backfills(config)[0]
        subprocess.run([CLI, "--config", str(config.path), "backfill", "pause", info["id"]], check=True,
                       capture_output=True, timeout=60)
        drainer = spawn(str(config.path), "drain")
        wait_until(lambda: _backfills(config)[0]["pages"] == info["pages_in_flight"], 60, "staged pages reconciled")
        recorded = _backfills(config)[0]
        assert recorded["rows_read"] == 100 * recorded["pages"]

        def agrees() -> bool:
            m = _scrape(port)
            return (m.get(("cdc_backfill_pages_total", table)), m.get(("cdc_backfill_rows_read_total", table)),
                    m.get(("cdc_backfill_rows_dropped_total", table))) == \
                (recorded["pages"], recorded["rows_read"], recorded["rows_dropped"])

        wait_until(agrees, 30, "pages and rows as `backfill list` records them")
        subprocess.run([CLI, "--config", str(config.path), "backfill", "resume", info["id"]], check=True,
                       capture_output=True, timeout=60)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert "completed" in out
        assert _backfills(config) == []  # nothing active left
        assert stop(drainer, 15, 60)[0] == 0
    finally:
        _kill(proc, *([drainer] if drainer else []))
