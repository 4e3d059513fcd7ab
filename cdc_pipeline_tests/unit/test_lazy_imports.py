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
