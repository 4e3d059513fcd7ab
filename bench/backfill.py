"""Backfill throughput, end to end, against the machine's own limits (not part of the test suite).

    python bench/backfill.py                  # 1,000,000 rows of ~250 bytes
    python bench/backfill.py --rows 200000 --skip-dlt
    python bench/backfill.py --rows 300000 --state-db   # state.dsn a database of its own, not the source's

In one fresh PostgreSQL cluster (durable settings), on the same table:
  * `COPY (SELECT ...) TO STDOUT` of the table (and of `to_jsonb` of its rows, what a backfill reads),
    read and discarded by the client: the most any reader gets out of this server;
  * this pipeline, with `cdc-pipeline drain` running:
      1. `cdc-pipeline backfill` alone (pages read, staged, reconciled by the drain; nothing delivering);
      2. end to end: a warm `cdc-pipeline deliver` (Spark) into a Postgres mirror running alongside,
         from the backfill's start until the mirror holds every row (the headline figure);
      3. where delivery's time goes: the rows of 1. delivered in this process, each stage timed;
    with the backfill process's peak RSS (os.wait4);
  * dlt's `sql_database` source (pyarrow backend) into a Postgres schema, installed into its own
    virtualenv on first use (never into the project's); --skip-dlt leaves it out;
  * Sling's full-refresh of the same table into another database of the cluster (the copy engine behind
    dagster-sling), timed as a command with its start-up, when its binary is there (`sling-linux-amd64`,
    a dev dependency, or `sling` on PATH); --skip-sling leaves it out.
The summary prints end to end against each of them (ratios), in rows/s and in CPU-seconds (the server's, its
ended backends' and the copy's own processes'): on a loaded machine the CPU ratio moves far less than the
wall-clock one, which depends on what else ran while each copy did.
Target: 100,000 rows/s end to end, and a backfill process under 1 GB whatever the table size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
import yaml  # noqa: E402

from bench._common import tree_cpu  # noqa: E402
from cdc_pipeline.postgres import embedded  # noqa: E402

CLI = str(Path(sys.executable).with_name("cdc-pipeline"))
DLT_VENV = Path(os.environ.get("CDC_BENCH_DLT_VENV", Path.home() / ".cache" / "cdc_pipeline" / "bench-dlt-venv"))
TABLE_DDL = """
CREATE TABLE public.bench (
  id bigint PRIMARY KEY, account_id integer NOT NULL, status text NOT NULL, amount numeric(12, 2) NOT NULL,
  currency char(3) NOT NULL, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL,
  email text NOT NULL, note text NOT NULL, flags integer[] NOT NULL
);
CREATE TABLE public.bench_warmup (id int PRIMARY KEY);
"""
FILL = """
INSERT INTO public.bench
SELECT g, g %% 50000, (ARRAY['new', 'paid', 'shipped', 'refunded'])[1 + g %% 4], (g %% 100000) / 100.0, 'EUR',
       '2024-01-01'::timestamptz + g * interval '1 second', '2025-01-01'::timestamptz + g * interval '1 second',
       'user' || g || '@example.com', md5(g::text) || md5((g + 1)::text) || repeat('n', 40), ARRAY[g %% 7, g %% 11]
FROM generate_series(%s::int, %s::int) g
"""


def log(msg: str) -> None:
    print(msg, flush=True)


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True)


def make_table(dsn: str, rows: int) -> float:
    with connect(dsn) as conn:
        conn.execute(TABLE_DDL)
        step = 250_000
        for lo in range(1, rows + 1, step):
            conn.execute(FILL, (lo, min(rows, lo + step - 1)))
        conn.execute("VACUUM ANALYZE public.bench")
        row = conn.execute("SELECT avg(pg_column_size(b.*))::float8 FROM public.bench b").fetchone()
        return float(row[0]) if row else 0.0


def copy_out(dsn: str, query: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    with connect(dsn) as conn, conn.cursor().copy(f"COPY ({query}) TO STDOUT") as copy:
        for _ in copy:
            n += 1
    return n, time.perf_counter() - t0


def count(dsn: str, table: str) -> int:
    with connect(dsn) as conn:
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
            return 0
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(row[0]) if row else 0


def spawn(config: Path, *args: str, log_path: Path) -> subprocess.Popen[bytes]:
    out = open(log_path, "wb")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([CLI, "--config", str(config), *args], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_rusage(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, int, float]:
    """(exit code, peak RSS in bytes, CPU seconds) of a child process, from wait4."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{proc.args} did not finish in {timeout} s")
        time.sleep(0.05)


def write_config(path: Path, src: str, dst: str, page: int, state: str | None = None) -> None:
    def sink(name: str) -> dict[str, Any]:
        return {"name": name, "tables": ["public.bench", "public.bench_warmup"],
                "destination": {"type": "postgres", "dsn": dst, "table": name + ".{table}", "mode": "mirror"}}

    path.write_text(yaml.safe_dump({
        "source": {"dsn": src, "slot": "bench", "publication": "bench"},
        **({"state": {"dsn": state}} if state else {}),
        "spark": {"master": "local[2]", "conf": {"spark.ui.showConsoleProgress": "false"}},
        "drain": {"batch_rows": 50000, "batch_ms": 200},
        "delivery": {"batch_size": 50000, "idle_seconds": 0.2},
        # no backpressure from the sinks here: each phase measures its own part
        "backfill": {"max_page_size": page, "initial_page_size": min(page, 10000), "max_sink_backlog": 10**9},
        "tables": [{"name": "public.bench"}, {"name": "public.bench_warmup"}],
        "sinks": [sink("mirror"), sink("solo")],
    }))


def warm(src: str, dst: str, sink: str, key: int, procs: list[subprocess.Popen[bytes]], workdir: Path) -> None:
    """Spark's first batch (JVM start, code generation) is not backfill time: deliver one row first."""
    with connect(src) as conn:
        conn.execute("INSERT INTO public.bench_warmup VALUES (%s)", (key,))
    deadline = time.monotonic() + 300
    while count(dst, f"{sink}.bench_warmup") < key:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("pipeline did not warm up; see " + str(workdir))
        time.sleep(0.1)


def run_backfill(config: Path, sink: str, workdir: Path) -> tuple[float, int, dict[str, Any]]:
    t0 = time.perf_counter()
    backfill = spawn(config, "backfill", "public.bench", "--sink", sink, "--quiet", "--json",
                     log_path=workdir / f"backfill_{sink}.log")
    code, rss, cpu = wait_rusage(backfill, timeout=3600)
    seconds = time.perf_counter() - t0
    text = (workdir / f"backfill_{sink}.log").read_text()
    if code != 0:
        raise RuntimeError(f"backfill failed ({code}): {text[-2000:]}")
    return seconds, rss, {**json.loads(text.strip().splitlines()[-1]), "cpu_s": cpu}


def wait_delivered(state: str, dst: str, backfill_id: str, deliver: subprocess.Popen[bytes], t0: float,
                   workdir: Path) -> float:
    """When the mirror holds the backfill's last read: the sink records its position in the destination in
    the transaction that writes the rows, so that is polled (a cheap read) instead of counting the mirror,
    which would scan it 20 times a second and take CPU from what is measured. Returns the time it did."""
    with connect(state) as conn:
        # Its last page's reads share that page's high watermark LSN (an index look-up, not a log scan).
        last = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log WHERE backfill_id = %s "
                            "AND commit_lsn = (SELECT max(high_lsn) FROM cdc_pipeline.backfill_pages "
                            "WHERE backfill_id = %s) ORDER BY commit_idx DESC LIMIT 1",
                            (backfill_id, backfill_id)).fetchone()
    if last is None:
        raise RuntimeError(f"backfill {backfill_id} logged no reads; see {workdir}")
    with connect(dst) as conn:
        while True:
            at = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline_sink.offsets WHERE sink = 'mirror'"
                              ).fetchone()
            if at is not None and tuple(at) >= tuple(last):
                return time.perf_counter()
            if time.perf_counter() - t0 > 3600 or deliver.poll() is not None:
                raise RuntimeError("delivery did not finish; see " + str(workdir))
            time.sleep(0.05)


def cluster_pid(cluster: embedded.EmbeddedPostgres) -> int:
    return int((cluster.data_dir / "postmaster.pid").read_text().split()[0])


def measured_cpu(cluster: embedded.EmbeddedPostgres, run: Any) -> tuple[Any, float]:
    """What ``run()`` returns, and the CPU seconds it cost: the server's and this process's children's."""
    import resource

    before = tree_cpu(cluster_pid(cluster)), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run()
    after = tree_cpu(cluster_pid(cluster)), resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (after[1].ru_utime + after[1].ru_stime) - (before[1].ru_utime + before[1].ru_stime)
    return result, after[0] - before[0] + children


def backend_cpu(dsn: str) -> list[tuple[str, float]]:
    """CPU seconds of each live server process by what it serves (since it started: the drain's and the
    deliverer's sessions began just before the measured run; the backfill's sessions have ended)."""
    with connect(dsn) as conn:
        rows = conn.execute("SELECT pid, backend_type, application_name, datname FROM pg_stat_activity").fetchall()
    spent = []
    for pid, kind, app, db in rows:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        spent.append((f"{kind} {app or ''} {db or ''}".strip(), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")))
    return sorted(spent, key=lambda x: -x[1])


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def pipeline(cluster: embedded.EmbeddedPostgres, workdir: Path, rows: int, page: int,
             state_db: bool = False) -> dict[str, Any]:
    src, dst = cluster.dsn("bench_src"), cluster.dsn("bench_dst")
    state = cluster.dsn("bench_state") if state_db else src
    config = workdir / "cdc.yaml"
    write_config(config, src, dst, page, state if state_db else None)
    subprocess.run([CLI, "--config", str(config), "setup"], check=True, capture_output=True)
    out: dict[str, Any] = {}
    drain = spawn(config, "drain", log_path=workdir / "drain.log")
    try:
        # 1. The backfill with the drain reconciling, nothing delivering: this part's own speed.
        seconds, rss, result = run_backfill(config, "solo", workdir)
        out.update(alone_s=seconds, alone_rss=rss, alone=result)
        log(f"  1. backfill alone (read, stage, reconciled by the drain; no delivery): {seconds:.1f} s = "
            f"{rows / seconds:,.0f} rows/s, peak RSS {rss / 2**20:,.0f} MiB")
        # 2. End to end: drain, a warm deliverer and the backfill at once, until the mirror is full.
        deliver = spawn(config, "deliver", "--sink", "mirror", log_path=workdir / "deliver.log")
        try:
            warm(src, dst, "mirror", 1, [drain, deliver], workdir)
            ours = [cluster_pid(cluster), drain.pid, deliver.pid]
            cpu0 = [tree_cpu(p) for p in ours]
            t0 = time.perf_counter()
            seconds, rss, result = run_backfill(config, "mirror", workdir)
            out.update(backfill_s=seconds, rss=rss, result=result)
            log(f"  2. end to end: backfill done after {seconds:.1f} s (delivery running alongside); "
                "waiting for the mirror")
            out["e2e_s"] = wait_delivered(state, dst, result["backfill_id"], deliver, t0, workdir) - t0
            split = [tree_cpu(p) - c for p, c in zip(ours, cpu0, strict=True)] + [result["cpu_s"]]
            out["e2e_cpu"], out["e2e_split"] = sum(split), split
            out["backends"] = backend_cpu(src)
            if count(dst, "mirror.bench") != rows:
                raise RuntimeError(f"the mirror does not hold the {rows:,} rows; see {workdir}")
        finally:
            stop(deliver)
    finally:
        stop(drain)
    log(f"     end to end (until the mirror holds every row): {out['e2e_s']:.1f} s = {rows / out['e2e_s']:,.0f} "
        f"rows/s; backfill process peak RSS {out['rss'] / 2**20:,.0f} MiB; {out['e2e_cpu']:.1f} CPU-seconds: "
        + ", ".join(f"{name} {c:.1f}" for name, c in zip(("server", "drain", "deliverer", "backfill"), out["e2e_split"],
                                                         strict=True)))
    log("     server processes by CPU-seconds: " + "; ".join(f"{name} {c:.1f}" for name, c in out["backends"][:6]))
    # 3. Where delivery's time goes: the same 1M reads (sink "solo") delivered in this process, timed.
    out["delivery"] = timed_delivery(config, rows)
    with connect(state) as conn:
        pages = conn.execute("SELECT count(*), max(page_size), avg(read_ms)::float8, sum(read_ms)::float8 "
                             "FROM cdc_pipeline.backfill_pages p JOIN cdc_pipeline.backfills b ON b.id = p.backfill_id "
                             "WHERE 'solo' = ANY(b.sinks)").fetchone()
    assert pages is not None
    out.update(pages=pages[0], max_page=pages[1], avg_read_ms=pages[2], read_s=(pages[3] or 0) / 1000)
    return out


def timed_delivery(config_path: Path, rows: int) -> dict[str, float]:
    """Deliver sink `solo` in-process, with the time of each delivery stage (wrapped, not changed)."""
    from collections import Counter

    from cdc_pipeline.config import load_config
    from cdc_pipeline.delivery import engine, reader, staging
    from cdc_pipeline.delivery.schedule import settle
    from cdc_pipeline.delivery.spark_stage import spark_session
    from cdc_pipeline.sinks.postgres import client as pg_sink
    from cdc_pipeline.state import change_log

    spent: Counter[str] = Counter()

    def timed(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name, None)
        if original is None:  # delivery's internals moved: report the total only
            return

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t0

        setattr(owner, name, wrapper)

    timed(change_log.ChangeLog, "load_batch", "load from the log (SQL -> Arrow; overlaps the sink)")
    timed(staging, "run_stage", "Spark stage (filter/transform/route/payload)")
    timed(staging, "run_arrow_stage", "Arrow stage (payload; overlaps the sink)")
    timed(reader, "messages_from", "Arrow -> messages")
    timed(pg_sink.PostgresSink, "_apply", "sink: COPY to stage + MERGE")
    timed(change_log.ChangeLog, "head_run", "find the next run of typed reads in the log")
    timed(pg_sink.PostgresSink, "deliver_typed_run", "typed run relayed: log COPY -> mirror COPY (or stage + INSERT/MERGE)")
    # Loading and staging run one batch ahead, beside the sink: time batches by when each was settled.
    sent: list[tuple[int, float]] = []
    original_settle, original_relay = settle.Settler.settle, reader.Reader.relay_run

    def settled(self: Any, conn: Any, stats: Any, window: Any, done: Any, offset: Any) -> Any:
        result = original_settle(self, conn, stats, window, done, offset)
        if done:
            sent.append((sum(o.call.read for o in done), time.perf_counter()))
        return result

    def relay(self: Any, conn: Any, source: Any, staged: Any, stats: Any) -> Any:
        result = original_relay(self, conn, source, staged, stats)
        if result[1] is None:  # relayed whole (else it goes on as calls, settled above)
            sent.append((staged.run.count, time.perf_counter()))
        return result

    settle.Settler.settle = settled  # type: ignore[method-assign]
    reader.Reader.relay_run = relay  # type: ignore[method-assign]
    config = load_config(config_path)
    spark = spark_session(config.spark)
    deliverer = engine.Deliverer(config, config.sink("solo"), spark)
    started = time.perf_counter()
    stats = deliverer.run(until_idle=True)
    if len(sent) < 2:
        raise RuntimeError("too few delivery batches to measure a rate: use more --rows")
    # The first batch pays for warm-up (connections, table creation, JIT): a running deliverer has paid it.
    warm_rows = sum(n for n, _ in sent[1:])
    warm_s = sent[-1][1] - sent[0][1]
    rate = warm_rows / warm_s if warm_s else 0.0
    log(f"  3. delivery alone (sink solo, in this process): {stats.delivered:,} messages in {len(sent)} batches; "
        f"after the first ({sent[0][1] - started:.1f} s) {rate:,.0f} msgs/s")
    total = sent[-1][1] - started
    for label, secs in spent.most_common():
        log(f"       {label:45s} {secs:6.1f} s ({100 * secs / total:.0f}% of delivery time)")
    return {"seconds": total, "rate": rate, **spent}


DLT_SCRIPT = textwrap.dedent("""
    import sys, time
    import dlt
    from dlt.sources.sql_database import sql_database
    src, dst = sys.argv[1], sys.argv[2]
    source = sql_database(credentials=src, schema="public", table_names=["bench"], backend="pyarrow")
    pipe = dlt.pipeline(pipeline_name="cdc_bench", destination=dlt.destinations.postgres(dst),
                        dataset_name="dlt_bench", pipelines_dir=sys.argv[3])
    t0 = time.perf_counter()
    info = pipe.run(source)
    print("SECONDS", time.perf_counter() - t0)
    print(info)
""")


def dlt_run(cluster: embedded.EmbeddedPostgres, workdir: Path) -> tuple[float | None, str]:
    python = DLT_VENV / "bin" / "python"
    ready = python.exists() and subprocess.run([str(python), "-c", "import dlt, sqlalchemy, pyarrow, psycopg2"],
                                                capture_output=True).returncode == 0
    if not ready:
        log(f"  installing dlt[postgres], sqlalchemy, pyarrow into {DLT_VENV} (once; never into the project's venv)")
        subprocess.run([sys.executable, "-m", "venv", str(DLT_VENV)], check=True)
        pip = subprocess.run([str(DLT_VENV / "bin" / "pip"), "install", "-q", "dlt[postgres]", "sqlalchemy", "pyarrow",
                              "psycopg2-binary"], capture_output=True, text=True)
        if pip.returncode != 0:
            return None, "dlt could not be installed: " + pip.stderr.strip()[-500:]
    url = f"postgresql://{cluster.user}:unused@127.0.0.1:{cluster.port}"  # dlt insists on a password (trust auth)
    script = workdir / "dlt_bench.py"
    script.write_text(DLT_SCRIPT)
    # SQLAlchemy 2.1 maps postgresql:// to psycopg 3: name the driver dlt installs.
    source_url = f"postgresql+psycopg2://{cluster.user}@127.0.0.1:{cluster.port}/bench_src"
    done = subprocess.run([str(python), str(script), source_url, f"{url}/dlt_dst", str(workdir / "dlt")],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        return None, "dlt run failed: " + done.stderr.strip()[-1500:]
    seconds = next(float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("SECONDS"))
    return seconds, done.stdout.strip().splitlines()[-1]


def sling_binary() -> str | None:
    """The Sling binary the wheel `sling-linux-amd64` ships (no download at run time), else `sling` on PATH."""
    try:
        from sling_linux_amd64 import SLING_BIN  # type: ignore[import-not-found]
    except ImportError:
        return shutil.which("sling")
    return SLING_BIN if SLING_BIN and os.access(SLING_BIN, os.X_OK) else shutil.which("sling")


def sling_run(cluster: embedded.EmbeddedPostgres, workdir: Path) -> tuple[float | None, str]:
    """`sling run` full-refresh of public.bench from bench_src into sling_dst: (seconds with start-up, detail)."""
    binary = sling_binary()
    if binary is None:
        return None, "sling: not installed (pip install sling-linux-amd64, in the project's [dev])"
    url = f"postgresql://{cluster.user}@127.0.0.1:{cluster.port}/{{}}?sslmode=disable"
    home = workdir / "sling"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "SLING_HOME_DIR": str(home), "SLING_DISABLE_TELEMETRY": "true"}
    started = time.perf_counter()
    done = subprocess.run([binary, "run", "--src-conn", url.format("bench_src"), "--src-stream", "public.bench",
                           "--tgt-conn", url.format("sling_dst"), "--tgt-object", "public.bench",
                           "--mode", "full-refresh"], capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return None, "sling run failed: " + (done.stderr or done.stdout).strip()[-1500:]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", done.stderr + done.stdout)  # its log is coloured whatever the terminal
    lines = [line for line in plain.splitlines() if "inserted" in line or "wrote" in line]
    return seconds, (lines[-1].strip() if lines else "done")[-200:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--page", type=int, default=50_000, help="backfill.max_page_size")
    ap.add_argument("--state-db", action="store_true",
                    help="state in a database of its own (state.dsn), not the source's (the default)")
    ap.add_argument("--skip-dlt", action="store_true")
    ap.add_argument("--skip-sling", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the cluster folder (its path is printed)")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="cdc_bench_backfill_"))
    root.chmod(0o755)  # the cluster runs as the postgres user, in a folder below
    cluster = embedded.create(root / "pg")
    cluster.start(durable=True)
    figures: dict[str, Any] = {}
    cpu: dict[str, float] = {}  # CPU seconds of each end-to-end copy, server included: a load-independent cost
    try:
        for db in ("bench_src", "bench_dst", "dlt_dst", "sling_dst", "bench_state"):
            cluster.create_database(db)
        src = cluster.dsn("bench_src")
        log(f"filling public.bench with {args.rows:,} rows ...")
        size = make_table(src, args.rows)
        log(f"  average row size {size:.0f} bytes (pg_column_size)")

        n, secs = copy_out(src, "SELECT * FROM public.bench")
        figures["copy"] = n / secs
        log(f"COPY (SELECT * FROM bench) TO STDOUT: {n:,} rows in {secs:.2f} s = {n / secs:,.0f} rows/s")
        n, secs = copy_out(src, "SELECT to_jsonb(b) FROM public.bench b")
        figures["copy_json"] = n / secs
        log(f"COPY (SELECT to_jsonb(b) ...) TO STDOUT: {n:,} rows in {secs:.2f} s = {n / secs:,.0f} rows/s")

        log("cdc_pipeline: backfill -> drain reconciliation -> Spark delivery -> Postgres mirror ...")
        run = pipeline(cluster, root, args.rows, args.page, args.state_db)
        figures["backfill_alone"] = args.rows / run["alone_s"]
        figures["delivery_alone"] = run["delivery"]["rate"]
        figures["e2e"] = args.rows / run["e2e_s"]
        cpu["e2e"] = run["e2e_cpu"]
        log(f"  backfill pages: {run['pages']} up to {run['max_page']} rows, select+stage {run['read_s']:.1f} s in "
            f"total ({run['avg_read_ms']:.0f} ms a page); the rest is watermarks, waits and reconciliation")

        if args.skip_dlt:
            log("dlt: skipped (--skip-dlt)")
        else:
            log("dlt sql_database (pyarrow backend) -> postgres ...")
            (seconds, detail), cpu["dlt"] = measured_cpu(cluster, lambda: dlt_run(cluster, root))
            if seconds is None:
                log(f"  {detail}")
            else:
                loaded = count(cluster.dsn("dlt_dst"), "dlt_bench.bench")
                figures["dlt"] = loaded / seconds
                log(f"  {loaded:,} rows in {seconds:.1f} s = {figures['dlt']:,.0f} rows/s, {cpu['dlt']:.1f} CPU-seconds "
                    f"({detail})")

        if args.skip_sling:
            log("sling: skipped (--skip-sling)")
        else:
            log("sling run --mode full-refresh (start-up included) -> postgres ...")
            (seconds, detail), cpu["sling"] = measured_cpu(cluster, lambda: sling_run(cluster, root))
            if seconds is None:
                log(f"  {detail}")
            else:
                loaded = count(cluster.dsn("sling_dst"), "public.bench")
                figures["sling"] = loaded / seconds
                log(f"  {loaded:,} rows in {seconds:.1f} s = {figures['sling']:,.0f} rows/s, {cpu['sling']:.1f} "
                    f"CPU-seconds ({detail})")

        log("\nsummary (rows/s): " + ", ".join(f"{k} {v:,.0f}" for k, v in figures.items()))
        for other in ("sling", "dlt"):
            if other in figures:
                log(f"end to end / {other}: {figures['e2e'] / figures[other]:.2f}x; backfill alone / {other}: "
                    f"{figures['backfill_alone'] / figures[other]:.2f}x; CPU-seconds {other} / end to end: "
                    f"{cpu[other] / cpu['e2e']:.2f}x (higher is better for us; the machine's load moves it less)")
        verdict = "meets" if figures["e2e"] >= 100_000 else "misses"
        peak = max(run["rss"], run["alone_rss"])
        log(f"end to end {verdict} the 100,000 rows/s target; backfill peak RSS {peak / 2**20:,.0f} MiB "
            f"({'under' if peak < 2**30 else 'over'} 1 GiB)")
    finally:
        if args.keep:
            cluster.stop()
            log(f"kept {root}")
        else:
            cluster.destroy()
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
