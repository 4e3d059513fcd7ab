"""`cdc-pipeline serve`: run the pull consumers' API under uvicorn until SIGTERM/SIGINT/SIGHUP."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import uvicorn

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.consumers.app import consumers_of, create_app
from cdc_pipeline.consumers.fastpath import FastPath
from cdc_pipeline.ops.signals import shutdown

log = logging.getLogger(__name__)


def server(config: PipelineConfig, host: str = "127.0.0.1", port: int = 8080, pool_size: int = 8) -> uvicorn.Server:
    """The server, stopped by our signals (run it with ``.run()``; ``.started`` once it accepts)."""
    names = list(consumers_of(config))  # fail here, before binding, when a token variable is missing
    if not names:
        log.warning("no http_pull sinks in %s: every consumer request will get 404", config.path)
    app, service = create_app(config, pool_size=pool_size)
    log.info("serving pull consumers %s on http://%s:%d (OpenAPI at /openapi.json)", names, host, port)
    # httptools and uvloop (uvicorn[standard]) are picked automatically; no access log line per request.
    built = _Server(uvicorn.Config(FastPath(app, service), host=host, port=port, access_log=False,
                                   log_level="info", timeout_graceful_shutdown=5))
    shutdown.on_stop(lambda: setattr(built, "should_exit", True))
    return built


class _Server(uvicorn.Server):
    """Signals are ours (ops/signals.py): SIGHUP stops it too, a second signal forces, and the process exits
    0 after a clean stop instead of re-raising the signal at itself as uvicorn does."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
