"""`cdc-pipeline serve`: run the pull consumers' API under uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import logging

import uvicorn

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.consumers.app import consumers_of, create_app
from cdc_pipeline.consumers.fastpath import FastPath

log = logging.getLogger(__name__)


def serve(config: PipelineConfig, host: str = "127.0.0.1", port: int = 8080, pool_size: int = 8) -> int:
    names = list(consumers_of(config))  # fail here, before binding, when a token variable is missing
    if not names:
        log.warning("no http_pull sinks in %s: every consumer request will get 404", config.path)
    app, service = create_app(config, pool_size=pool_size)
    log.info("serving pull consumers %s on http://%s:%d (OpenAPI at /openapi.json)", names, host, port)
    # httptools and uvloop (uvicorn[standard]) are picked automatically; no access log line per request.
    uvicorn.run(FastPath(app, service), host=host, port=port, access_log=False, log_level="info",
                timeout_graceful_shutdown=5)
    return 0
