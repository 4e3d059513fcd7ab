"""A sink that is down entirely: nothing is lost, the slot keeps advancing, delivery catches up."""

from __future__ import annotations

import uuid

import psycopg
import pytest
import redis

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.sinks.base import SinkUnavailable
from cdc_pipeline_tests.helpers import deliver
from cdc_pipeline_tests.netfaults import TcpProxy


def _confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                           (slot,)).fetchone()
        return int(row[0])


def test_broker_down_then_back(source_db, write_config, spark):
    proxy = TcpProxy(6379).start()
    stream = f"cdc_outage_{uuid.uuid4().hex[:8]}"
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "outage", "publication": "outage"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 100},
        "tables": [{"name": "public.t"}],
        "sinks": [{"name": "stream", "tables": ["public.t"],
                   "destination": {"type": "redis_stream", "url": f"redis://127.0.0.1:{proxy.port}/0",
                                   "stream_key": stream}}],
    })
    setup(config)
    r = redis.Redis()
    try:
        source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g")
        Drain(config).run(until_idle=True)
        deliver(config, spark, sink="stream")
        assert r.xlen(stream) == 100

        proxy.stop()  # the broker is gone
        before = _confirmed(source_db.dsn, "outage")
        for i in range(1, 6):  # the source keeps writing; the drain keeps the slot moving
            source_db.execute("UPDATE t SET n = %s", (i,))
            Drain(config).run(until_idle=True)
            with pytest.raises(SinkUnavailable):
                deliver(config, spark, sink="stream")
        assert _confirmed(source_db.dsn, "outage") > before
        with psycopg.connect(config.state_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM cdc_pipeline.failed_messages").fetchone() == (0,)

        proxy.start()  # back on the same port
        stats = deliver(config, spark, sink="stream")
        assert stats.delivered == 500 and stats.lag_messages == 0
        entries = r.xrange(stream)
        assert len(entries) == 600
        keys = [tuple(map(int, e[1][b"key"].decode().split(":"))) for e in entries]
        assert keys == sorted(keys)  # commit order, nothing lost or duplicated
    finally:
        proxy.stop()
        r.delete(stream)
