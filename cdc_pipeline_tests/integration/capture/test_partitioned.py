"""Partitioned tables configured by their parent's name, as users run them: `drain` and `deliver` as long-running
processes, writers inserting, updating, deleting and moving rows between partitions (sub-partitions included),
and a backfill of the parent beside them. The mirror ends equal to the source; the append sink holds every
change once, per key in order, and its history replayed gives the source's rows."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from cdc_pipeline.admin.check import check
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.evolving import (
    Writers,
    assert_append_history,
    caught_up,
    logs,
    mirror_and_append,
    processes,
    source_records,
)
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, wait_until

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
    path = str(config.path)
    with processes(tmp_path) as start, Writers(source_db.dsn, _step) as writers:
        drain = start("--config", path, "drain")
        deliver = start("--config", path, "deliver")
        wait_until(lambda: writers.changes > 300, 60, "the writers to get going")
        backfill = start("--config", path, "backfill", "public.ev")
        assert backfill.wait(180) == 0, logs(tmp_path)
        wait_until(lambda: writers.changes > 1500, 120, "more changes after the backfill")
        writers.stop()
        want = int(source_db.execute("SELECT count(*) FROM public.ev")[0][0])

        wait_until(lambda: caught_up(config, source_db.dsn, dest.dsn, "public.ev", "id, region"), 120,
                   "the sinks to catch up")
        for proc in (deliver, drain):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, logs(tmp_path)
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
