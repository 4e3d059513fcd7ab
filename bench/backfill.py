"""Backfill throughput, end to end, against the machine's own limits (not part of the test suite).

    python bench/backfill.py                  # 1,000,000 rows of ~250 bytes
    python bench/backfill.py --rows 200000 --skip-dlt

In one fresh PostgreSQL cluster (durable settings), on the same table:
  1. `COPY (SELECT ...) TO STDOUT` of the table, read and discarded by the client: the floor of any reader;
  2. this pipeline end to end: `cdc-pipeline backfill` (keyset pages between watermarks, staged), the
     drain reconciling every page (`cdc-pipeline drain`), and delivery to a Postgres mirror
     (`cdc-pipeline deliver`, Spark), from the backfill's start until the mirror holds every row; with
     the backfill process's peak RSS (os.wait4);
  3. dlt's `sql_database` source (pyarrow backend) into a Postgres schema, installed into its own
     virtualenv on first use (never into the project's); --skip-dlt leaves it out.
Target: 100,000 rows/s end to end, and a backfill process under 1 GB whatever the table size.
"""

from __future__ import annotations

import argparse
import json
import os
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
FROM generate_series(%s, %s) g
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


def wait_rusage(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of a child process, from wait4."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss * 1024
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{proc.args} did not finish in {timeout} s")
        time.sleep(0.05)


def pipeline(cluster: embedded.EmbeddedPostgres, workdir: Path, rows: int, page: int) -> dict[str, Any]:
    src, dst = cluster.dsn("bench_src"), cluster.dsn("bench_dst")
    config = workdir / "cdc.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"dsn": src, "slot": "bench", "publication": "bench"},
        "spark": {"master": "local[2]"},
        "drain": {"batch_rows": 50000, "batch_ms": 200, "idle_seconds": 0.5},
        "delivery": {"batch_size": 50000, "idle_seconds": 0.2},
        "backfill": {"max_page_size": page, "initial_page_size": min(page, 10000)},
        "tables": [{"name": "public.bench"}, {"name": "public.bench_warmup"}],
        "sinks": [{"name": "mirror", "tables": ["public.bench", "public.bench_warmup"],
                   "destination": {"type": "postgres", "dsn": dst, "table": "mirror.{table}", "mode": "mirror"}}],
    }))
    subprocess.run([CLI, "--config", str(config), "setup"], check=True, capture_output=True)
    drain = spawn(config, "drain", log_path=workdir / "drain.log")
    deliver = spawn(config, "deliver", "--sink", "mirror", log_path=workdir / "deliver.log")
    try:
        # Warm up: Spark's first batch (JVM start, code generation) is not backfill time.
        with connect(src) as conn:
            conn.execute("INSERT INTO public.bench_warmup VALUES (1)")
        deadline = time.monotonic() + 180
        while count(dst, "mirror.bench_warmup") < 1:
            if time.monotonic() > deadline or deliver.poll() is not None or drain.poll() is not None:
                raise RuntimeError("pipeline did not warm up; see " + str(workdir))
            time.sleep(0.2)
        log("  pipeline warm (drain and deliverer running); backfill starts")
        t0 = time.perf_counter()
        backfill = spawn(config, "backfill", "public.bench", "--quiet", "--json", log_path=workdir / "backfill.log")
        code, rss = wait_rusage(backfill, timeout=3600)
        t_backfill = time.perf_counter() - t0
        if code != 0:
            raise RuntimeError(f"backfill failed ({code}): {(workdir / 'backfill.log').read_text()[-2000:]}")
        result = json.loads((workdir / "backfill.log").read_text().strip().splitlines()[-1])
        log(f"  backfill done (all pages reconciled) after {t_backfill:.1f} s; waiting for the mirror")
        while count(dst, "mirror.bench") < rows:
            if time.perf_counter() - t0 > 3600 or deliver.poll() is not None:
                raise RuntimeError("delivery did not finish; see " + str(workdir))
            time.sleep(0.05)
        t_e2e = time.perf_counter() - t0
    finally:
        for proc in (deliver, drain):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    with connect(src) as conn:
        pages = conn.execute("SELECT count(*), max(page_size), avg(read_ms)::float8, sum(read_ms)::float8 "
                             "FROM cdc_pipeline.backfill_pages").fetchone()
    assert pages is not None
    return {"backfill_s": t_backfill, "e2e_s": t_e2e, "rss": rss, "result": result, "pages": pages[0],
            "max_page": pages[1], "avg_read_ms": pages[2], "read_s": (pages[3] or 0) / 1000}


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
    if not python.exists():
        log(f"  installing dlt[postgres,sql_database] + pyarrow into {DLT_VENV} (once)")
        subprocess.run([sys.executable, "-m", "venv", str(DLT_VENV)], check=True)
        pip = subprocess.run([str(DLT_VENV / "bin" / "pip"), "install", "-q", "dlt[postgres,sql_database]", "pyarrow",
                              "psycopg2-binary"], capture_output=True, text=True)
        if pip.returncode != 0:
            return None, "dlt could not be installed: " + pip.stderr.strip()[-500:]
    url = f"postgresql://{cluster.user}@127.0.0.1:{cluster.port}"
    script = workdir / "dlt_bench.py"
    script.write_text(DLT_SCRIPT)
    done = subprocess.run([str(python), str(script), f"{url}/bench_src", f"{url}/dlt_dst", str(workdir / "dlt")],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        return None, "dlt run failed: " + done.stderr.strip()[-1500:]
    seconds = next(float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("SECONDS"))
    return seconds, done.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--page", type=int, default=50_000, help="backfill.max_page_size")
    ap.add_argument("--skip-dlt", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the cluster folder (its path is printed)")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="cdc_bench_backfill_"))
    root.chmod(0o755)  # the cluster runs as the postgres user, in a folder below
    cluster = embedded.create(root / "pg")
    cluster.start(durable=True)
    figures: dict[str, Any] = {}
    try:
        for db in ("bench_src", "bench_dst", "dlt_dst"):
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

        log("cdc_pipeline backfill -> drain reconciliation -> Spark delivery -> Postgres mirror ...")
        run = pipeline(cluster, root, args.rows, args.page)
        figures["backfill"] = args.rows / run["backfill_s"]
        figures["e2e"] = args.rows / run["e2e_s"]
        log(f"  backfill (read, stage, reconciled by the drain): {run['backfill_s']:.1f} s = "
            f"{figures['backfill']:,.0f} rows/s; {run['pages']} pages up to {run['max_page']} rows, "
            f"select+stage {run['read_s']:.1f} s in total ({run['avg_read_ms']:.0f} ms a page)")
        log(f"  end to end (until the mirror holds every row): {run['e2e_s']:.1f} s = {figures['e2e']:,.0f} rows/s")
        log(f"  backfill process peak RSS: {run['rss'] / 2**20:,.0f} MiB")

        if args.skip_dlt:
            log("dlt: skipped (--skip-dlt)")
        else:
            log("dlt sql_database (pyarrow backend) -> postgres ...")
            seconds, detail = dlt_run(cluster, root)
            if seconds is None:
                log(f"  {detail}")
            else:
                loaded = count(cluster.dsn("dlt_dst"), "dlt_bench.bench")
                figures["dlt"] = loaded / seconds
                log(f"  {loaded:,} rows in {seconds:.1f} s = {figures['dlt']:,.0f} rows/s ({detail})")

        log("\nsummary (rows/s): " + ", ".join(f"{k} {v:,.0f}" for k, v in figures.items()))
        verdict = "meets" if figures["e2e"] >= 100_000 else "misses"
        log(f"end to end {verdict} the 100,000 rows/s target; backfill peak RSS {run['rss'] / 2**20:,.0f} MiB "
            f"({'under' if run['rss'] < 2**30 else 'over'} 1 GiB)")
    finally:
        if args.keep:
            cluster.stop()
            log(f"kept {root}")
        else:
            cluster.destroy()
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
