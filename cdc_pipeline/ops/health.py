"""The metrics port: `/metrics` (Prometheus text), `/healthz` (the process's loops turn) and `/readyz` (its
connections are up; a deliverer is not waiting on an outage), each answering 200 or 503 with the reason in
the body. A small threaded http.server: no event loop to share with the command it watches."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.metrics_registry import REGISTRY

log = logging.getLogger(__name__)

# A check returns None when fine, else the reason it is not.
Check = Callable[[], str | None]


class OpsServer:
    """Binds in the constructor (OSError when the port is taken); `stop` closes the socket, ends the serving
    thread and unregisters ``registered`` (the collector it serves), so a process may start another."""

    def __init__(self, host: str, port: int, live: list[Check], ready: list[Check],
                 registered: Collector | None = None) -> None:
        self.live, self.ready, self.registered = live, ready, registered
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="ops-http", daemon=True)

    def start(self) -> OpsServer:
        self._thread.start()
        log.info("metrics and health on port %d (/metrics, /healthz, /readyz)", self.port)
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
            self._thread.join()
        self.httpd.server_close()
        if self.registered is not None:
            REGISTRY.unregister(self.registered)
            self.registered = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # no line per scrape
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    checks = server.live if path == "/healthz" else server.ready
                    reasons = [r for r in (_run(c) for c in checks) if r]
                    body = ("not ready: " if path == "/readyz" else "unhealthy: ") + "; ".join(reasons) \
                        if reasons else "ok"
                    self._send(503 if reasons else 200, (body + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found: /metrics, /healthz, /readyz\n", "text/plain; charset=utf-8")

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


def _run(check: Check) -> str | None:
    try:
        return check()
    except Exception as exc:  # a failing check is an answer, not a crash of the server
        return f"check failed: {type(exc).__name__}"


def start_ops(config: PipelineConfig, port: int | None, runners: Callable[[], list[Any]],
              ready: list[Check] | None = None, status_ready: bool = True) -> OpsServer | None:
    """Serve metrics and health for this command when a port is given (`--metrics-port`, else
    `metrics.port`); None when off. Readiness includes the databases answering `status` unless
    ``status_ready`` is False (a command that needs only the state database checks that itself)."""
    port = port if port is not None else config.metrics.port
    if port is None:
        return None
    collector, checks = register_pipeline_metrics(config, runners, ready, status_ready)
    try:
        return OpsServer(config.metrics.host, port, live=[], ready=checks, registered=collector).start()
    except BaseException:
        REGISTRY.unregister(collector)
        raise


def register_pipeline_metrics(config: PipelineConfig, runners: Callable[[], list[Any]],
                              ready: list[Check] | None = None, status_ready: bool = True
                              ) -> tuple[Collector, list[Check]]:
    """Register this process's pipeline collector (what `/metrics` serves besides the histograms) and
    return it with the readiness checks; the caller unregisters it (OpsServer.stop does)."""
    from cdc_pipeline.admin import status
    from cdc_pipeline.ops.metrics import PipelineCollector

    collector = PipelineCollector(lambda: status.collect(config), runners)
    REGISTRY.register(collector)

    def state_db() -> str | None:
        collector.status()
        return collector.status_error  # "source database: ..." or "state database: ...", or None

    return collector, [*([state_db] if status_ready else []), *(ready or [])]


def state_reachable(config: PipelineConfig, timeout_s: int = 3) -> Check:
    """Ready while a new session to the state database answers (what `serve` needs, nothing else)."""
    from cdc_pipeline.postgres import session

    def check() -> str | None:
        try:
            with session.connect(config.state_dsn, autocommit=True, connect_timeout=timeout_s,
                                 application_name="cdc_pipeline readyz") as conn:
                conn.execute("SELECT 1")
        except Exception as exc:  # the reason, never the DSN
            return f"state database: {type(exc).__name__}"
        return None

    return check
