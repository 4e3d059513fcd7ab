"""Lanes that read only their share (core/lanes.py, state/change_log.py): with a split hashed in SQL, each of
2 lanes reads, stages and settles about half the log, the two halves exactly the log; the database's lane of a
row is Python's; and a split made by an older version (CRC-32, a state schema before the hash) is re-split by
the first lane of this version with nothing lost or sent twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.admin.status import collect
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.lanes import MD5, lane_of, parking_group
from cdc_pipeline.delivery.lazy_spark import LazySpark
from cdc_pipeline.state import schema
from cdc_pipeline.state.change_log import ChangeLog, LaneShare
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config

KEYS = 1500


def _config(source: Database, dest: Database, write_config: Callable[..., PipelineConfig]) -> PipelineConfig:
    data: dict[str, Any] = mirror_config(source.dsn, dest.dsn, ["public.t"], lanes=2)
    data["sinks"].append({"name": "app", "tables": ["public.t"], "lanes": 2, "message_grouping": False,
                          "destination": {"type": "postgres", "dsn": dest.dsn, "table": "out.events",
                                          "mode": "append"}})
    return write_config(data)


def _write(source: Database) -> None:
    source.execute("INSERT INTO public.t SELECT 'k' || g || CASE WHEN g %% 5 = 0 THEN 'ü' ELSE '' END, 0 "
                   "FROM generate_series(1, %s) g", (KEYS,))
    source.execute("UPDATE public.t SET v = 1 WHERE length(id) % 2 = 0")


def _log(config: PipelineConfig) -> list[tuple[tuple[int, int], str]]:
    """Every change of the log: its position and its group (table and key)."""
    with psycopg.connect(config.state_dsn) as conn:
        return [((int(r[0]), int(r[1])), r[2]) for r in conn.execute(
            "SELECT commit_lsn, commit_idx, concat_ws('|', table_schema, table_name, pk) "
            "FROM cdc_pipeline.change_log ORDER BY 1, 2")]


def test_each_of_two_lanes_reads_about_half_and_the_database_hashes_as_python(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.t (id text PRIMARY KEY, v integer NOT NULL)")
    config = _config(source_db, dest, write_config)
    setup(config)
    _write(source_db)
    drain(config)
    log = _log(config)
    spark = LazySpark(config.spark)
    reads = [deliver(config, spark, "mirror", lane=lane).read for lane in (0, 1)]
    assert sum(reads) == len(log) and all(0.4 * len(log) < n < 0.6 * len(log) for n in reads), reads
    assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t")
    lanes = collect(config)["sinks"]["mirror"]["lanes"]
    assert [lane["rows_read"] for lane in lanes] == reads  # `status` (and the gauge-free metric) show it

    # The database's lane of each row is the one core/lanes.py computes, grouped (with a key of non-ASCII
    # text) and not; blocks of a few rows, so most end on another lane's row.
    with psycopg.connect(config.state_dsn) as conn:
        for grouped in (True, False):
            for lane in range(3):
                block = ChangeLog("cdc_pipeline").load_lane_block(conn, ["public.t"], (0, -1), len(log),
                                                                  LaneShare(lane, 3, grouped))
                got = list(zip(block.batch.column("commit_lsn").to_pylist(),
                               block.batch.column("commit_idx").to_pylist(), strict=True))
                want = [pos for pos, group in log
                        if lane_of(group if grouped else parking_group(None, pos), 3, MD5) == lane]
                assert got == want and block.end == log[-1][0] and block.covered == len(log)
            short = ChangeLog("cdc_pipeline").load_lane_block(conn, ["public.t"], log[0][0], 7,
                                                              LaneShare(0, 3, grouped))
            assert short.end == log[7][0] and short.covered == 7 and short.batch.num_rows <= 7

    # Ungrouped lanes: each message once, about half each.
    app = [deliver(config, spark, "app", lane=lane) for lane in (0, 1)]
    assert [s.delivered for s in app] == [s.read for s in app] and sum(s.read for s in app) == len(log)
    assert all(0.4 * len(log) < s.read < 0.6 * len(log) for s in app)


def test_a_split_of_an_older_version_is_resplit_with_nothing_lost_or_sent_twice(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig],
        monkeypatch: pytest.MonkeyPatch) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.t (id text PRIMARY KEY, v integer NOT NULL)")
    config = _config(source_db, dest, write_config)
    lane_hash = next(i for i, ddl in enumerate(schema.MIGRATIONS) if "prior_hashing" in ddl)
    with monkeypatch.context() as m:  # the state schema of the version before the lane hash
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:lane_hash])
        setup(config)
    _write(source_db)
    drain(config)
    log = _log(config)
    # Where an older version's two lanes of `app` (ungrouped: CRC-32 of "~lsn:idx") had stopped: a third and
    # two thirds into the log.
    old = [log[len(log) // 3][0], log[2 * len(log) // 3][0]]
    with psycopg.connect(config.state_dsn) as conn:
        conn.execute("INSERT INTO cdc_pipeline.sink_lanes (sink, lanes) VALUES ('app', 2)")
        conn.execute("INSERT INTO cdc_pipeline.sink_offsets (sink, lane, commit_lsn, commit_idx) VALUES "
                     "('app', 0, %s, %s), ('app', 1, %s, %s)", (*old[0], *old[1]))
    setup(config)  # migrates the state schema: the split keeps CRC-32
    spark = LazySpark(config.spark)
    for lane in (0, 1):  # the first re-splits to MD5 (same N); the old split's settled messages are skipped
        deliver(config, spark, "app", lane=lane)
    with psycopg.connect(config.state_dsn) as conn:
        assert conn.execute("SELECT lanes, hashing, prior_hashing FROM cdc_pipeline.sink_lanes "
                            "WHERE sink = 'app'").fetchone() == (2, MD5, [1])
    sent = [key for (key,) in dest.execute("SELECT idempotency_key FROM out.events")]
    assert len(sent) == len(set(sent))
    want = {f"{pos[0]}:{pos[1]}" for pos, _ in log if pos > old[lane_of(parking_group(None, pos), 2)]}
    assert set(sent) == want
