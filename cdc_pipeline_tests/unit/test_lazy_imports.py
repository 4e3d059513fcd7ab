"""A `deliver` whose sinks need no Spark work never imports pyspark (a third of a second of every start-up,
issue 23/25): what the delivery path imports at module level is checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

DELIVERY_PATH = [
    "cdc_pipeline.cli", "cdc_pipeline.cli.delivery", "cdc_pipeline.delivery.engine", "cdc_pipeline.delivery.together",
    "cdc_pipeline.delivery.lazy_spark", "cdc_pipeline.delivery.replay", "cdc_pipeline.ops.health",
    "cdc_pipeline.sinks.webhook.client", "cdc_pipeline.sinks.postgres.client", "cdc_pipeline.sinks.nats.client",
    "cdc_pipeline.sinks.redis_stream.client", "cdc_pipeline.sinks.rabbitmq.client",
]


def test_the_delivery_path_does_not_import_pyspark_or_dagster() -> None:
    code = ("import importlib, sys\n"
            f"for m in {DELIVERY_PATH!r}: importlib.import_module(m)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('pyspark', 'dagster')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_plain_http_webhook_deliver_imports_no_anyio_h2_nor_psutil() -> None:
    """Start-up costs a `deliver` to an http:// webhook does not pay (the whole process is timed by the
    benchmark): anyio's blocking portal (~17 ms; the sinks' loop is asyncio.Runner's), hyper-h2 (~10 ms;
    HTTP/2 is offered over https only) and psutil (~8 ms; a forced stop imports it). The sink is built,
    opened and closed: its event loop is started too."""
    code = ("import importlib, sys\n"
            f"for m in {DELIVERY_PATH!r}: importlib.import_module(m)\n"
            "from cdc_pipeline.config import parse_config\n"
            "from cdc_pipeline.sinks import build_sink\n"
            "config = parse_config(\"source: {dsn: 'postgresql://u@h/db'}\\ntables: [{name: t}]\\n"
            "sinks: [{name: hook, tables: [t], destination: {type: webhook, url: 'http://127.0.0.1:9/hook'}}]\\n\","
            " 'cdc.yaml')\n"
            "sink = build_sink(config.sink('hook'), {})\n"
            "sink.open()\n"
            "sink.close()\n"
            "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('anyio', 'h2', 'hpack', "
            "'psutil')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
