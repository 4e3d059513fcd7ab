"""The drain's self-healing keys: defaults and errors that name the file and key."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc_pipeline.capture.faults import DrainFatal, permanent, transient
from cdc_pipeline.config import ConfigError, parse_config
from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.replication import ReplicationError

MINIMAL = 'source: {dsn: "postgresql://localhost/shop"}\ntables: [{name: orders}]\n'


def test_defaults() -> None:
    drain = parse_config(MINIMAL, "cdc.yaml", {}).drain
    assert (drain.status_interval_seconds, drain.retry_initial_ms, drain.retry_max_ms, drain.batch_bytes,
            drain.on_gap) == (10, 500, 30000, 64 * 1024 * 1024, "stop")


@pytest.mark.parametrize("drain, expected", [
    ("{on_gap: ignore}", "cdc.yaml: drain.on_gap"),
    ("{retry_initial_ms: 5000, retry_max_ms: 1000}", "drain.retry_max_ms: must be at least retry_initial_ms (5000)"),
    ("{batch_bytes: 0}", "drain.batch_bytes"),
    ("{status_interval_seconds: -1}", "drain.status_interval_seconds"),
])
def test_errors_name_the_key(drain: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(MINIMAL + f"drain: {drain}\n", "cdc.yaml", {})
    assert expected in str(info.value)


def test_user_options_are_merged_ours_forced_last() -> None:
    info = session.conninfo("host=h dbname=d options='-c work_mem=7MB -c synchronous_commit=off' "
                            "keepalives_idle=99", durable=True, statement_timeout_ms=5)
    parsed = conninfo_to_dict(info)
    options = parsed["options"]
    assert "-c work_mem=7MB" in options
    assert options.index("synchronous_commit=off") < options.index("synchronous_commit=on")
    assert options.index("statement_timeout=5") < options.index("work_mem=7MB")  # the user may override it
    assert parsed["keepalives_idle"] == "99" and parsed["connect_timeout"] == "10"


def test_fault_classes() -> None:
    assert permanent(ReplicationError('replication slot "s" does not exist', "42704"), "s", "p", True)
    assert "invalidated" in (permanent(ReplicationError("can no longer get changes from replication slot", "55000"),
                                       "s", "p", True) or "")
    assert permanent(ReplicationError('publication "p" does not exist', "42704"), "s", "p", True)
    assert permanent(DrainFatal("x"), "s", "p", True) == "x"
    busy = ReplicationError('replication slot "s" is active for PID 1', "55006")
    assert permanent(busy, "s", "p", streamed_before=False) and not permanent(busy, "s", "p", streamed_before=True)
    assert transient(busy)
    assert transient(ReplicationError("replication stream ended: terminating connection", "57P01"))
    assert transient(ReplicationError("replication stream ended: server closed the connection"))
    assert not transient(KeyError(1))
