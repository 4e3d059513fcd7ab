"""`cdc-pipeline demo`: the whole pipeline on an embedded PostgreSQL, with the Dagster UI.

Starts a throwaway cluster (wal_level=logical, password auth) in a private folder, creates sample tables (orders with a few
days of history) and a small steady write load, writes a cdc.yaml (orders partitioned by day on
`updated_at`), runs setup, and starts `dagster dev`: its sensors keep a long-lived drain run and a
long-lived delivery run streaming into a mirror database. In the UI: the lineage (source tables ->
change log -> sink), lag on the change log and the sink (a materialization a minute while data moves,
lag checks that turn red within seconds), and the daily partitions of `cdc/snapshot/public/orders_snapshot` to
backfill. The console says what is happening (demo/console.py); Dagster's own output goes to
`dagster.log` in the demo's folder. Stops what it started on Ctrl-C, SIGTERM or SIGHUP (or after
--seconds).
"""

from __future__ import annotations

import os
import pwd
import random
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import ConfigError, load_config
from cdc_pipeline.config.errors import describe_error
from cdc_pipeline.demo import console
from cdc_pipeline.demo.dagster_dev import DagsterDev, free_port
from cdc_pipeline.ops.signals import shutdown
from cdc_pipeline.postgres import embedded, session

DEMO_DIR_ENV = "CDC_DEMO_DIR"

SCHEMA = """
CREATE TABLE IF NOT EXISTS customers (id bigint PRIMARY KEY, name text NOT NULL, tier text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL,
    amount numeric(12,2) NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['free','pro','enterprise'])[1 + g % 3], now()
    FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING;
-- A few days of history, so the daily partitions have something to backfill.
INSERT INTO orders (customer_id, status, amount, updated_at)
    SELECT 1 + g % 1000, (ARRAY['paid','shipped','refunded'])[1 + g % 3], (g % 500) + 0.99,
           now() - make_interval(secs => g * 86400.0 * %(days)s / 5000)
    FROM generate_series(1, 5000) g WHERE NOT EXISTS (SELECT 1 FROM orders);
"""
HISTORY_DAYS = 4


def _load(dsn: str, stop: threading.Event, per_second: float = 20.0) -> None:
    """A small steady write load: new orders, status changes, the odd delete."""
    with session.connect(dsn, autocommit=True) as conn:
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


def demo_root() -> Path:
    """A private folder for the demo: $CDC_DEMO_DIR if it is one (a real folder, ours, closed to group and
    others; it is reused), else a fresh mkdtemp (mode 0700). Never a fixed name under the shared temp
    folder, which another local user could prepare (symlinks, a planted cluster) before us."""
    given = os.environ.get(DEMO_DIR_ENV)
    owner = pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()
    if not given:
        root = Path(tempfile.mkdtemp(prefix="cdc_pipeline_demo_"))
        if os.geteuid() == 0:
            os.chown(root, owner, -1)  # the cluster runs as postgres; root reads it anyway
        return root
    root = Path(given)
    if not root.exists():
        root.mkdir(mode=0o700, parents=True)
        if os.geteuid() == 0:
            os.chown(root, owner, -1)
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{DEMO_DIR_ENV}={root}: not a folder (symlinks are refused)")
    if st.st_uid not in (owner, os.geteuid()):
        raise ConfigError(f"{DEMO_DIR_ENV}={root}: owned by another user (uid {st.st_uid}); refusing to use it")
    if st.st_mode & 0o077:
        raise ConfigError(f"{DEMO_DIR_ENV}={root}: open to other users (mode {stat.S_IMODE(st.st_mode):o}); "
                          "use a folder with mode 0700")
    return root


def prepare(root: Path, metrics: int | None = None) -> tuple[embedded.EmbeddedPostgres, Path]:
    cluster = embedded.create(root / "pg", password=secrets.token_urlsafe(24))
    if not cluster.is_running():
        cluster.start()
    for db in ("demo", "demo_mirror", "dagster"):
        cluster.create_database(db)
    with session.connect(cluster.dsn("demo"), autocommit=True) as conn:
        conn.execute(SCHEMA.replace("%(days)s", str(HISTORY_DAYS)))
    first_day = (datetime.now(UTC) - timedelta(days=HISTORY_DAYS + 1)).date().isoformat()
    cfg = {
        "source": {"dsn": cluster.dsn("demo"), "slot": "cdc_demo", "publication": "cdc_demo"},
        "spark": {"master": "local[2]"},
        # The runs serve /metrics: the drain on this port, the sink's run on the next (printed by the guide).
        **({"metrics": {"run_ports_from": metrics}} if metrics else {}),
        "tables": [{"name": "public.customers"},
                   {"name": "public.orders", "sort_column": "updated_at",
                    "partitions": {"kind": "daily", "start": first_day}}],
        "sinks": [{"name": "orders_mirror", "tables": ["public.customers", "public.orders"],
                   "destination": {"type": "postgres", "dsn": cluster.dsn("demo_mirror"),
                                   "table": "mirror.{table}", "mode": "mirror"}}],
    }
    path = root / "cdc.yaml"  # holds the DSNs with the password: readable by us only
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(cfg, sort_keys=False))
    for line in setup(load_config(path)):
        print(f"setup: {line}")
    return cluster, path


SENSORS = ["cdc_drain_sensor", "cdc_delivery_sensor"]


def run_demo(port: int = 3000, seconds: float | None = None, ui: bool = True, keep: bool = False) -> int:
    """Until ``seconds`` have passed or a signal (ops/signals.py) asks it to stop: then it terminates the runs
    (they end Canceled), stops `dagster dev` (its daemon, webserver, code server, run workers and their JVMs)
    and the cluster, and removes its temporary folder unless ``keep``; a second signal kills them at once."""
    temporary = not os.environ.get(DEMO_DIR_ENV)
    root = demo_root()
    metrics = metrics_ports()
    cluster, config_path = prepare(root, metrics)
    shutdown.on_force(lambda: cluster.stop(mode="immediate"))  # a daemon: not among our descendants
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(cluster.dsn("demo"), stop), daemon=True)
    loader.start()
    log_path = root / "dagster.log"
    log = log_path.open("ab")
    dev = DagsterDev(root / "dagster_home", config_path, cluster.dsn("dagster"), port=port, log=log)
    try:
        if ui:
            _start_ui(dev, log_path, config_path, stop)
            mirror = cluster.dsn("demo_mirror").replace(f" password={cluster.password}", "")
            print(guide(port, config_path, mirror, cluster.root / "password", log_path, metrics, root,
                        temporary and not keep), flush=True)
        else:
            _pipeline_loop(config_path, stop)
        deadline = None if seconds is None else time.monotonic() + seconds
        while deadline is None or time.monotonic() < deadline:
            if dev.proc is not None and dev.proc.poll() is not None:
                return dev.proc.returncode or 1
            if shutdown.requested.wait(1):
                break
    except KeyboardInterrupt:  # run_demo called without the CLI's signal handlers
        pass
    finally:
        stop.set()
        _stop_ui(dev)
        log.close()
        cluster.stop()
        _clean_up(root, temporary and not keep)
    return 0


def _start_ui(dev: DagsterDev, log_path: Path, config_path: Path, stop: threading.Event) -> None:
    console.say("starting Dagster (dagster dev: webserver, daemon, code server); this takes a minute")
    dev.start()  # default signal handling in the child, its own process group: stopped by its id
    for watch in (lambda: console.forward_problems(log_path, stop),
                  lambda: console.report(load_config(config_path), stop)):
        threading.Thread(target=watch, daemon=True).start()
    try:
        dev.wait_loaded(cancel=shutdown.requested.is_set)
        for sensor in SENSORS:  # a kept folder's sensors were stopped at its last exit: on again
            dev.reset_sensor(sensor)
    except TimeoutError:  # a slow machine: the UI comes up later, the pipeline is already running
        console.say(f"Dagster is slow to load its code location; see {log_path}")


def _stop_ui(dev: DagsterDev) -> None:
    """The runs first, as the UI's Terminate does (they end Canceled, their batch committed), then dagster dev."""
    if dev.proc is None or dev.proc.poll() is not None:
        return
    print("stopping the demo: the runs (they end Canceled), dagster dev, then the database", flush=True)
    try:
        ended = dev.cancel_runs(SENSORS)
        if ended:
            console.say("runs ended: " + ", ".join(f"{what} ({run_id[:8]})" for run_id, what in ended.items()))
    except Exception as exc:  # dagster dev not answering: stopping it still stops its runs
        console.say(f"could not terminate the runs through Dagster ({describe_error(exc)}); stopping it")
    dev.stop()


def _clean_up(root: Path, remove: bool) -> None:
    if remove:
        shutil.rmtree(root, ignore_errors=True)
        print(f"removed the demo's folder {root} (--keep keeps it)", flush=True)
    else:
        print(f"kept the demo's folder {root}", flush=True)


def metrics_ports(sinks: int = 1) -> int:
    """A base port P with P (the drain run) and P+1.. (each sink's run) free: metrics.run_ports_from."""
    for _ in range(50):
        base = free_port()
        if base + sinks < 65536 and all(_free(base + 1 + i) for i in range(sinks)):
            return base
    raise RuntimeError("no free ports for the demo's metrics")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def guide(port: int, config: Path, mirror: str, pw: Path, log: Path, metrics: int, root: Path,
          removed: bool) -> str:
    exe = Path(sys.executable).with_name("cdc-pipeline")
    cli = f"{exe if exe.exists() else 'cdc-pipeline'} --config {config}"
    return GUIDE.format(port=port, cli=cli, config=config, mirror=mirror, pw=pw, log=log, m0=metrics, m1=metrics + 1,
                        root=root, at_exit="removed at exit (--keep keeps it)" if removed else "kept at exit")


GUIDE = """
Dagster UI: http://127.0.0.1:{port}   (Ctrl-C stops the demo: the runs end Canceled)
  Lineage:   Lineage (top bar): source/public/* -> cdc/change_log -> sink/orders_mirror, and
             cdc/snapshot/public/orders_snapshot (the backfill) feeding the sink.
  Live lag:  Runs: one cdc_drain run and one deliver_orders_mirror run stream (started by the sensors within
             ~30 s). Catalog > sink/orders_mirror: a materialization a minute while data moves (lag, offset,
             throughput; its data version is the sink's offset); Checks tab: lag_below_max and
             no_stale_parked_messages. cdc/change_log: slot_lag_below_max.
  Backfill:  Catalog > cdc/snapshot/public/orders_snapshot > Materialize > pick one or more daily partitions
             (the last {days} days have history) > Launch backfill. At most 2 run at once; progress is in the
             runs' logs; rows reach the mirror as read messages without stale reads.
  Failed messages: the sink's no_stale_parked_messages check lists them; Jobs >
             retry_failed_messages_orders_mirror (or discard_...) > Launchpad, config ids / table / all.
config: {config}
status:  {cli} status
failed:  {cli} failed list
metrics: http://127.0.0.1:{m0}/metrics (the drain run), http://127.0.0.1:{m1}/metrics (orders_mirror's run)
mirror:  PGPASSWORD=$(cat {pw}) psql "{mirror}" -c 'select count(*) from mirror.orders'
Dagster's log (every event, the daemon, Spark): {log}
folder:  {root}, {at_exit}
""".replace("{days}", str(HISTORY_DAYS))


def _pipeline_loop(config_path: Path, stop: threading.Event) -> None:
    """Without the UI: drain and deliver in this process, printing status."""
    from cdc_pipeline.admin import status
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
