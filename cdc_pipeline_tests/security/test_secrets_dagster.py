"""Secrets through real Dagster runs (not just the step thread): the backfill watermark keys (`mac_key`)
never appear in a run's event log (logs, asset metadata, checks), in `status` or in CLI logs; a replay
whose destination echoes credentials leaves them out of the run's logs, step error and metadata."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterInstance
from dagster._serdes import serialize_value

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.defs import build_definitions
from cdc_pipeline.defs.replay import REPLAY_JOB
from cdc_pipeline_tests.helpers import deliver, drain, mirror_config
from cdc_pipeline_tests.integration.admin.test_cli_errors import CLI
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill_config, drain_running
from cdc_pipeline_tests.integration.sinks.test_sink_webhook import Receiver


def run_log(instance: DagsterInstance, run_id: str) -> str:
    """Everything Dagster stored for a run: messages, step errors with their causes, metadata."""
    return "\n".join(serialize_value(entry) for entry in instance.all_logs(run_id))


def mac_keys(config_dsn: str) -> list[str]:
    with psycopg.connect(config_dsn) as conn:
        return [r[0] for r in conn.execute("SELECT mac_key::text FROM cdc_pipeline.backfills")]


def test_mac_key_never_shown(source_db, db_factory, write_config, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    source_db.execute("CREATE TABLE public.a (id int PRIMARY KEY); CREATE TABLE public.b (id int PRIMARY KEY)")
    source_db.execute("INSERT INTO a SELECT generate_series(1, 300); INSERT INTO b SELECT generate_series(1, 300)")
    config = write_config(backfill_config(source_db.dsn, db_factory().dsn, ["public.a", "public.b"],
                                          {"initial_page_size": 100, "max_page_size": 100}))
    setup(config)
    defs = build_definitions(str(config.path))
    shown: list[str] = []
    with DagsterInstance.ephemeral() as instance, drain_running(config):
        result = defs.resolve_job_def("backfill_public_a").execute_in_process(instance=instance)
        assert result.success
        shown.append(run_log(instance, result.run_id))
        # The CLI's own backfill, logging at INFO, and every read-out of backfills.
        for args in (["-v", "backfill", "public.b"], ["backfill", "list"], ["status"], ["status", "--json"]):
            proc = subprocess.run([CLI, *args[:1], "--config", str(config.path), *args[1:]], capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            shown.append(proc.stdout + proc.stderr)
    shown.append(caplog.text)
    keys = mac_keys(config.state_dsn)
    assert len(keys) == 2 and all(len(k) >= 32 for k in keys), keys
    assert "backfill_id" in shown[0] and "rows_read" in shown[0] and "completed" in shown[1]
    for text in shown:
        for key in keys:
            assert key not in text and key.replace("-", "") not in text


SECRETS = ("Hunter2Secret", "KvPairSecret", "HeaderTokenSecret99")


@pytest.fixture
def token() -> str:
    os.environ["CDC_TEST_HOOK_TOKEN"] = SECRETS[2]
    yield SECRETS[2]
    del os.environ["CDC_TEST_HOOK_TOKEN"]


def test_replay_failure_in_dagster_masks_secrets(source_db, db_factory, write_config, spark, token: str) -> None:
    receiver = Receiver()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    data = mirror_config(source_db.dsn, db_factory().dsn, ["public.t"])
    data["sinks"] = [{"name": "hook", "tables": ["public.t"],
                      "destination": {"type": "webhook", "url": receiver.url, "batch_size": 1,
                                      "headers": {"Authorization": "Bearer ${CDC_TEST_HOOK_TOKEN}"}}}]
    config = write_config(data)
    setup(config)
    start = source_db.execute("SELECT clock_timestamp()")[0][0].isoformat()
    source_db.execute("INSERT INTO t VALUES (1), (2)")
    drain(config)
    deliver(config, spark, sink="hook")
    assert len(receiver.acked_keys()) == 2

    # Now the endpoint rejects each message, echoing the request's token and someone's DSN password.
    def echo(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        return 400, (f"rejected; auth was {headers.get('authorization')}; upstream "
                     f"postgresql://app:{SECRETS[0]}@db.example/x password={SECRETS[1]}").encode(), 0.0

    receiver.behaviour = echo
    try:
        defs = build_definitions(str(config.path))
        with DagsterInstance.ephemeral() as instance:
            run = defs.resolve_job_def(REPLAY_JOB).execute_in_process(
                instance=instance, raise_on_error=False,
                run_config={"ops": {"replay_window": {"config": {"sink": "hook", "start": start}}}})
            assert not run.success
            text = run_log(instance, run.run_id)
        # The CLI prints the same figures.
        proc = subprocess.run([CLI, "--config", str(config.path), "replay", "--sink", "hook", "--from", start],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and "HTTP 400" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        text += proc.stdout + proc.stderr
    finally:
        receiver.stop()
    assert "failed during the replay" in text and "HTTP 400" in text and "db.example" in text, text[-3000:]
    for secret in SECRETS:
        assert secret not in text, secret
