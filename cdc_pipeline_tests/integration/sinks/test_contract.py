"""The sink contract: every sink type (one fixture each in conftest.py) against its real server, through the
whole pipeline (a real source table, the drain, the delivery engine): every message once and each group in
commit order, idempotency keys and headers (a mirror instead: the source's rows, inserts, updates and deletes
applied), a poison message isolated and counted in the metrics, an outage waited for and not counted, a
SIGKILL mid-window losing nothing, an unreachable destination refused without its secret."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from cdc_pipeline.admin import status
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.ops.metrics import PipelineCollector
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import OutboundMessage, SinkUnavailable
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import deliver, drain, wait_until
from cdc_pipeline_tests.integration.delivery.test_delivery_outage import Background
from cdc_pipeline_tests.integration.sinks.contract import (
    GROUPS,
    POISON,
    TEXT,
    SinkUnderTest,
    applied,
    failed,
    first_seen,
    holds_every_change,
    in_group_order,
    keys,
    logged,
    pipeline,
    settled,
    source_rows,
    write,
)
from cdc_pipeline_tests.processes import spawn

WriteConfig = Callable[..., PipelineConfig]


@pytest.mark.contract("history")
def test_every_message_arrives_once_and_each_group_in_commit_order(
        sut: SinkUnderTest, source_db: Database, write_config: WriteConfig, spark: Any) -> None:
    config = pipeline(source_db, write_config, sut)
    write(source_db, 1, 20, updates=2)
    drain(config)
    stats = deliver(config, spark, sink="s")
    log, got = logged(config), sut.received()
    assert len(log) == 60 and stats.delivered == 60 and stats.lag_messages == 0
    assert sorted(keys(got)) == sorted(e.key for e in log)  # each once
    if sut.ordered:
        in_group_order(got, log)
    for g in got:  # the bytes of the source's text, unchanged
        assert g.message["record"]["v"].rstrip("+") == TEXT.format(g.message["record"]["id"])


@pytest.mark.contract("mirror")
def test_mirror_holds_the_source_rows(sut: SinkUnderTest, source_db: Database, write_config: WriteConfig,
                                      spark: Any) -> None:
    """Inserts, updates and deletes applied: the destination holds the source's rows, their text unchanged."""
    assert sut.state is not None
    config = pipeline(source_db, write_config, sut)
    write(source_db, 1, 20, updates=2)
    source_db.execute("DELETE FROM t WHERE id % 5 = 0")
    write(source_db, 21, 24, updates=0)
    drain(config)
    stats = deliver(config, spark, sink="s")
    assert stats.delivered == len(logged(config)) == 68 and stats.lag_messages == 0
    assert sut.state() == source_rows(source_db) == applied(config)
    assert all(row["v"].rstrip("+") == TEXT.format(i) for i, row in sut.state().items())


@pytest.mark.contract("history")
def test_idempotency_keys_and_headers(sut: SinkUnderTest, source_db: Database, write_config: WriteConfig,
                                      spark: Any) -> None:
    config = pipeline(source_db, write_config, sut)
    write(source_db, 1, 6, updates=1)
    drain(config)
    deliver(config, spark, sink="s")
    got = sut.received()
    assert len(got) == 12
    for g in got:
        meta = g.message["metadata"]
        assert meta["idempotency_key"] == f"{meta['commit_lsn']}:{meta['commit_idx']}"
        assert (meta["table_schema"], meta["table_name"]) == ("public", "t")
        assert set(g.message) == {"record", "changes", "action", "metadata"}
        if g.key is not None:  # the destination's own id of the message is the idempotency key
            assert g.key == meta["idempotency_key"]
        want = sut.headers(g.message)
        assert {k: g.headers.get(k) for k in want} == want


@pytest.mark.contract("poison")
def test_poison_message_is_isolated_and_counted(sut: SinkUnderTest, source_db: Database, write_config: WriteConfig,
                                                spark: Any) -> None:
    """Row POISON's insert is refused by the destination: it is parked, its group's later messages are held
    behind it, every other group flows; the metrics say so."""
    config = pipeline(source_db, write_config, sut, poisoned=True)
    write(source_db, 1, 12, updates=1)
    drain(config)
    deliverer = Deliverer(config, config.sink("s"), spark)
    stats = deliverer.run(until_idle=True)
    log = logged(config)
    poison = next(i for i, e in enumerate(log) if e.id == POISON)
    behind = [e.key for e in log[poison:] if e.group == POISON % GROUPS]
    parked = failed(config)
    assert [k for k, _, _ in parked] == behind
    assert parked[0][2] != HELD and parked[0][1] == "parked", parked[0]  # the destination's own refusal
    assert {e for _, _, e in parked[1:]} == {HELD}
    # Every other message arrived; the poison did not. (A sink that sends a whole call at once may have sent
    # its group's later ones too: parked all the same, redelivered after it, the idempotency key naming them.)
    if sut.state is not None:
        assert sut.state() == applied(config, without=behind)
    else:
        got = keys(sut.received())
        assert sorted(set(got)) == sorted(got) and behind[0] not in got
        assert {e.key for e in log if e.key not in behind} <= set(got)
    samples = {(m.name, s.labels.get("sink")): s.value for m in PipelineCollector(
        lambda: status.collect(config), lambda: [deliverer]).collect() for s in m.samples}
    assert samples[("cdc_sink_messages_delivered", "s")] == stats.delivered == len(log) - len(behind)
    assert samples[("cdc_sink_messages_parked", "s")] == len(behind)
    assert samples[("cdc_sink_parked_messages", "s")] == len(behind)
    assert samples[("cdc_sink_lag_messages", "s")] == 0


@pytest.mark.contract("outage")
def test_outage_is_waited_for_and_not_counted(sut: SinkUnderTest, source_db: Database, write_config: WriteConfig,
                                              spark: Any) -> None:
    """max_retries 0: one failure counted against a message would discard it."""
    config = pipeline(source_db, write_config, sut)
    deliverer = Deliverer(config, config.sink("s"), spark)
    running = Background(lambda: deliverer.run(until_idle=False), deliverer.stop)
    try:
        write(source_db, 1, 5, updates=0)
        drain(config)
        # settled, not only received: an outage must not cut a call whose acknowledgements are still coming
        wait_until(lambda: settled(config) == 5 and holds_every_change(sut, config), 60, "the first rows")
        with sut.outage():
            write(source_db, 6, 10, updates=1)
            drain(config)
            wait_until(lambda: deliverer.stats is not None and deliverer.stats.outage_retries >= 2, 120,
                       "two retries of the outage")
            assert running.is_alive(), running.error
            assert deliverer.stats is not None and deliverer.stats.waiting
            assert failed(config) == []
        wait_until(lambda: holds_every_change(sut, config), 120, "every change after the outage")
        stats = running.finish()
    finally:
        deliverer.stop()
    assert stats.parked == 0 and stats.discarded == 0 and failed(config) == []
    if sut.state is not None:
        assert sut.state() == source_rows(source_db)
    else:
        log = logged(config)
        assert set(first_seen(sut.received())) == {e.key for e in log}
        if sut.ordered:
            in_group_order(sut.received(), log)


@pytest.mark.contract("sigkill")
def test_sigkill_mid_window_loses_nothing(sut: SinkUnderTest, source_db: Database, write_config: WriteConfig,
                                          spark: Any) -> None:
    """A `deliver` process killed while calls are out: the next run redelivers what was not settled (at least
    once: the idempotency key names a repeat), every group still in commit order by first arrival."""
    config = pipeline(source_db, write_config, sut, grouped=False, batch_size=2)
    first, rows = 1, 100
    for _ in range(4):  # a fast destination may settle a whole run before the kill lands: again, 4x as much
        write(source_db, first, first + rows - 1, updates=1)
        drain(config)
        before = settled(config)
        proc = spawn(str(config.path), "deliver", "--sink", "s")
        try:
            wait_until(lambda p=proc, b=before: p.poll() is not None or settled(config) > b, 120, "the first calls settled")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err
        if settled(config) < len(logged(config)):
            break  # killed mid-way
        first, rows = first + rows, rows * 4
    else:
        pytest.fail("every deliver run had settled everything before it was killed")
    deliver(config, spark, sink="s")
    if sut.state is not None:
        assert sut.state() == source_rows(source_db)
        return
    log = logged(config)
    got = sut.received()
    assert set(first_seen(got)) == {e.key for e in log}
    if sut.ordered:
        in_group_order(got, log, by_key=True)


@pytest.mark.contract("unreachable")
def test_unreachable_destination_is_unavailable_without_its_secret(sut: SinkUnderTest, source_db: Database,
                                                                   write_config: WriteConfig) -> None:
    assert sut.unreachable is not None
    config = write_config({"source": {"dsn": source_db.dsn}, "tables": [{"name": "public.t"}],
                           "sinks": [{"name": "s", "tables": ["public.t"], "destination": sut.unreachable()}]})
    sink = build_sink(config.sink("s"))
    started = time.monotonic()
    with pytest.raises(SinkUnavailable) as info:
        sink.open()
        sink.deliver([OutboundMessage("1:0", None, None, b'{"record":{"id":1}}')])
    sink.close()
    assert time.monotonic() - started < 60
    assert sut.secret is None or sut.secret not in str(info.value)
