"""`cdc-pipeline demo`: the whole pipeline on an embedded PostgreSQL, with the Dagster UI.

Starts a throwaway cluster (wal_level=logical) under /tmp, creates sample tables with a small write
load, writes a cdc.yaml, runs setup, and starts `dagster dev` whose drain sensor streams the slot and
launches delivery runs into a mirror database. Stops what it started on Ctrl-C (or after --seconds).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import yaml

from cdc_pipeline.config import load_config
from cdc_pipeline.postgres import embedded
from cdc_pipeline.setup import setup

DEMO_ROOT = Path(os.environ.get("CDC_DEMO_DIR", "/tmp/cdc_pipeline_demo"))
PROJECT = Path(__file__).resolve().parents[1]

SCHEMA = """
CREATE TABLE IF NOT EXISTS customers (id bigint PRIMARY KEY, name text NOT NULL, tier text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL,
    amount numeric(12,2) NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['free','pro','enterprise'])[1 + g % 3], now()
    FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING;
"""


def _load(dsn: str, stop: threading.Event, per_second: float = 20.0) -> None:
    """A small steady write load: new orders, status changes, the odd delete."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.wait(1.0 / per_second):
            r = random.random()
            if r < 0.5:
                conn.execute("INSERT INTO orders (customer_id, status, amount) VALUES (%s, 'new', %s)",
                             (random.randint(1, 1000), round(random.uniform(1, 500), 2)))
            elif r < 0.9:
                conn.execute("UPDATE orders SET status = %s, updated_at = now() WHERE id = "
                             "(SELECT id FROM orders ORDER BY random() LIMIT 1)",
                             (random.choice(["paid", "shipped", "refunded"]),))
            else:
                conn.execute("DELETE FROM orders WHERE id = (SELECT min(id) FROM orders)")


def prepare() -> tuple[embedded.EmbeddedPostgres, Path]:
    cluster = embedded.create(DEMO_ROOT / "pg")
    if not cluster.is_running():
        cluster.start()
    for db in ("demo", "demo_mirror", "dagster"):
        cluster.create_database(db)
    with psycopg.connect(cluster.dsn("demo"), autocommit=True) as conn:
        conn.execute(SCHEMA)
    cfg = {
        "source": {"dsn": cluster.dsn("demo"), "slot": "cdc_demo", "publication": "cdc_demo"},
        "spark": {"master": "local[2]"},
        "drain": {"tick_seconds": 10, "heartbeat_seconds": 5},
        "tables": [{"name": "public.customers"}, {"name": "public.orders", "sort_column": "updated_at"}],
        "sinks": [{"name": "orders_mirror", "tables": ["public.customers", "public.orders"],
                   "destination": {"type": "postgres", "dsn": cluster.dsn("demo_mirror"),
                                   "table": "mirror.{table}", "mode": "mirror"}}],
    }
    path = DEMO_ROOT / "cdc.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for line in setup(load_config(path)):
        print(f"setup: {line}")
    return cluster, path


def run_demo(port: int = 3000, seconds: float | None = None, ui: bool = True) -> int:
    cluster, config_path = prepare()
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(cluster.dsn("demo"), stop), daemon=True)
    loader.start()
    home = DEMO_ROOT / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text((PROJECT / "dagster.yaml").read_text())
    env = dict(os.environ, CDC_CONFIG=str(config_path), DAGSTER_HOME=str(home),
               DAGSTER_PG_URL=cluster.url("dagster"))
    proc = None
    try:
        if ui:
            # Default signal handling in the child, and its own process group so we can stop all of it.
            proc = subprocess.Popen(
                [sys.executable, "-m", "dagster", "dev", "-w", str(PROJECT / "workspace.yaml"),
                 "-h", "127.0.0.1", "-p", str(port)], cwd=PROJECT, env=env, start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            print(f"Dagster UI: http://127.0.0.1:{port}  (Ctrl-C stops the demo)")
            print(f"config: {config_path}; mirror: {cluster.dsn('demo_mirror')}")
        else:
            _pipeline_loop(config_path, stop)
        deadline = None if seconds is None else time.monotonic() + seconds
        while deadline is None or time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                return proc.returncode or 1
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        cluster.stop()
    return 0


def _pipeline_loop(config_path: Path, stop: threading.Event) -> None:
    """Without the UI: drain and deliver in this process, printing status."""
    from cdc_pipeline import status
    from cdc_pipeline.capture.drain import Drain
    from cdc_pipeline.delivery.engine import Deliverer
    from cdc_pipeline.delivery.spark_stage import spark_session

    config = load_config(config_path)
    spark = spark_session(config.spark)

    def loop() -> None:
        while not stop.is_set():
            Drain(config).run(seconds=5)
            for sink in config.sinks:
                Deliverer(config, sink, spark).run(until_idle=True)
            print(status.render(status.collect(config)), flush=True)

    threading.Thread(target=loop, daemon=True).start()
