"""Partitioned tables configured by their parent's name, as users run them: `drain` and `deliver` as long-running
processes, writers inserting, updating, deleting and moving rows between partitions (sub-partitions included),
and a backfill of the parent beside them. The mirror ends equal to the source; the append sink holds every
change once, per key in order, and its history replayed gives the source's rows."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.check import check
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.admin.status import collect, render
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.defs.health import sink_figures
from cdc_pipeline.state.backfills import BackfillSpec, BackfillStore
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.evolving import (
    Writers,
    assert_append_history,
    caught_up,
    logs,
    mirror_and_append,
    processes,
    source_records,
    streaming,
)
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, mirror_config, sync, wait_until

# Two levels: 'eu' is itself partitioned by id range; 'us' and the default partition are leaves.
PARTITIONED = """
CREATE TABLE public.ev (id integer NOT NULL, region text NOT NULL, v integer NOT NULL, note text,
                        PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE public.ev_eu PARTITION OF public.ev FOR VALUES IN ('eu') PARTITION BY RANGE (id);
CREATE TABLE public.ev_eu_lo PARTITION OF public.ev_eu FOR VALUES FROM (MINVALUE) TO (500);
CREATE TABLE public.ev_eu_hi PARTITION OF public.ev_eu FOR VALUES FROM (500) TO (MAXVALUE);
CREATE TABLE public.ev_us PARTITION OF public.ev FOR VALUES IN ('us');
CREATE TABLE public.ev_other PARTITION OF public.ev DEFAULT;
INSERT INTO public.ev SELECT g, (ARRAY['eu', 'us', 'apac'])[g % 3 + 1], 0, 'before' FROM generate_series(1, 600) g;
"""
REGIONS = ("eu", "us", "apac")
KEYS = 1000


def _step(conn: psycopg.Connection, n: int) -> int:
    """One change of a random kind; returns the change messages it causes (a move is a delete and an insert)."""
    key, kind = n % KEYS, n % 5
    if kind == 0:  # move every row of the key to the next region (a cross-partition update)
        cur = conn.execute("UPDATE public.ev SET region = CASE region WHEN 'eu' THEN 'us' WHEN 'us' THEN 'apac' "
                           "ELSE 'eu' END WHERE id = %s", (key,))
        return 2 * cur.rowcount
    if kind == 1:
        return conn.execute("DELETE FROM public.ev WHERE id = %s", (key,)).rowcount
    if kind == 2:  # within a partition
        return conn.execute("UPDATE public.ev SET v = v + 1, note = 'w' WHERE id = %s", (key,)).rowcount
    return conn.execute("INSERT INTO public.ev VALUES (%s, %s, 0, NULL) ON CONFLICT DO NOTHING",
                        (key, REGIONS[n % 3])).rowcount


def test_partitioned_parent_through_changes_and_backfill(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig],
        tmp_path: Path) -> None:
    dest = db_factory()
    source_db.execute(PARTITIONED)
    config = write_config(mirror_and_append(source_db.dsn, dest.dsn, "public.ev", "out.events"))
    setup(config)
    assert source_db.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = 'cdc_test'") == [(True,)]
    with streaming(tmp_path, config) as pipeline, Writers(source_db.dsn, _step) as writers:
        wait_until(lambda: writers.changes > 300, 60, "the writers to get going")
        pipeline.run("backfill", "public.ev")
        wait_until(lambda: writers.changes > 1500, 120, "more changes after the backfill")
        writers.stop()
        want = int(source_db.execute("SELECT count(*) FROM public.ev")[0][0])
        pipeline.stop_when(lambda: caught_up(config, source_db.dsn, dest.dsn, "public.ev", "id, region"))
    assert assert_mirrored(source_db.dsn, "public.ev", dest.dsn, "mirror.ev", order="id, region") == want
    # The log names only the parent, never a partition.
    names = source_db.execute("SELECT DISTINCT table_name FROM cdc_pipeline.change_log WHERE table_schema = 'public'")
    assert names == [("ev",)]
    assert_append_history(dest.dsn, "out.events", ("id", "region"), source_records(source_db.dsn, "public.ev"),
                          changes=writers.changes)
    moves = dest.execute("SELECT count(*) FROM out.events WHERE action = 'delete'")[0][0]
    assert moves > 0


def test_existing_publication_brought_to_the_root(source_db: Database, db_factory: Callable[[], Database],
                                                 write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    source_db.execute(PARTITIONED)
    source_db.execute("CREATE PUBLICATION cdc_test FOR TABLE public.ev")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.ev"]))
    findings = [str(f) for f in check(config, sinks=False)]
    assert any("publish_via_partition_root" in f and "setup" in f for f in findings), findings
    done = setup(config)
    assert any("publish_via_partition_root" in d for d in done), done
    assert source_db.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = 'cdc_test'") == [(True,)]
    assert not any("publish_via_partition_root" in str(f) for f in check(config, sinks=False))


@pytest.mark.pg_matrix
@pytest.mark.parametrize("partition", ["public.ev_us", "public.ev_eu_lo"])
def test_a_partition_beside_its_parent_is_an_error(source_db: Database, db_factory: Callable[[], Database],
                                                   write_config: Callable[..., PipelineConfig], partition: str) -> None:
    dest = db_factory()
    source_db.execute(PARTITIONED)
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.ev", partition]))
    errors = [str(f) for f in check(config, sinks=False) if f.level == "error"]
    assert any(partition in e and "twice" in e for e in errors), errors


ATTACHABLE = """
CREATE TABLE public.at (id integer NOT NULL, region text NOT NULL, v integer, PRIMARY KEY (id, region))
    PARTITION BY LIST (region);
CREATE TABLE public.at_eu PARTITION OF public.at FOR VALUES IN ('eu');
"""


def _attach_with_rows(db: Database, region: str) -> None:
    """A table filled on its own, then attached: PostgreSQL decodes none of its rows; changes follow."""
    db.execute(f"CREATE TABLE public.at_{region} (LIKE public.at INCLUDING ALL); "  # noqa: S608 - test constants
               f"INSERT INTO public.at_{region} SELECT g, '{region}', g FROM generate_series(1, 40) g; "
               f"ALTER TABLE public.at ATTACH PARTITION public.at_{region} FOR VALUES IN ('{region}'); "
               f"INSERT INTO public.at VALUES (100, '{region}', 0); "
               f"UPDATE public.at SET v = -1 WHERE id = 7 AND region = '{region}'")


def test_partition_attached_with_rows(source_db: Database, db_factory: Callable[[], Database],
                                      write_config: Callable[..., PipelineConfig], spark: Any,
                                      tmp_path: Path) -> None:
    """Its rows are read again automatically (a backfill the drain starts); when that cannot start (another
    backfill of the table holds its sinks), `status` and the sink assets' metadata name the one command, and
    running it makes every sink whole."""
    dest = db_factory()
    source_db.execute(ATTACHABLE)
    config = write_config(mirror_and_append(source_db.dsn, dest.dsn, "public.at", "out.at"))
    setup(config)
    source_db.execute("INSERT INTO public.at SELECT g, 'eu', g FROM generate_series(1, 30) g")

    def synced() -> bool:
        sync(config, spark)
        deliver(config, spark, sink="app")
        return caught_up(config, source_db.dsn, dest.dsn, "public.at", "id, region")

    wait_until(synced, 120, "the first rows")
    _attach_with_rows(source_db, "us")
    wait_until(synced, 120, "the attached partition's rows, read again")
    assert "reread_blocked" not in collect(config)["schema_changes"]["public.at"]

    # Another backfill of the table, run by a live process, holds its sinks: the re-read cannot start.
    store = BackfillStore(config.state.schema_name)
    with psycopg.connect(config.state_dsn, autocommit=True) as holder:
        held, _ = store.claim(holder, BackfillSpec("public.at", ("app", "mirror"), "id", "1", "5"), ("id", "region"),
                              ("id", "region"), "test", None)
        _attach_with_rows(source_db, "apac")
        sync(config, spark)
        deliver(config, spark, sink="app")
        store.set_status(holder, held, "cancelled")
    fix = "cdc-pipeline backfill public.at"
    assert collect(config)["schema_changes"]["public.at"]["reread_blocked"]["fix"] == fix
    assert any(line.startswith("FINDING: public.at") and f"`{fix}`" in line for line in render(collect(config)).splitlines())
    assert fix in sink_figures(config, config.sink("mirror"))["last_schema_change"]
    assert dest.execute("SELECT count(*) FROM mirror.at WHERE region = 'apac'") == [(2,)]  # only the decoded ones
    with processes(tmp_path) as start:  # the command, as the finding gives it, beside a running drain
        drain = start("--config", str(config.path), "drain")
        backfill = start("--config", str(config.path), *fix.split()[1:])
        assert backfill.wait(120) == 0, logs(tmp_path)
        drain.send_signal(signal.SIGTERM)
        assert drain.wait(60) == 0, logs(tmp_path)
    wait_until(synced, 120, "the backfill's reads")
    assert "reread_blocked" not in collect(config)["schema_changes"]["public.at"]
    assert_append_history(dest.dsn, "out.at", ("id", "region"), source_records(source_db.dsn, "public.at"))
