"""Stored `last_error` values are masked when they are written, not only when `failed list` shows them: an
endpoint that rejects a message with a body quoting someone's DSN password, a `password=` pair and a bearer
token gets that message parked and then discarded, and the state table itself never holds the secrets."""

from __future__ import annotations

import subprocess
import time

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import drain, mirror_config
from cdc_pipeline_tests.integration.admin.test_cli_errors import CLI
from cdc_pipeline_tests.integration.sinks.test_sink_webhook import Receiver

SECRETS = ("Hunter2Secret", "KvPairSecret", "BearerTokenSecret123")
ECHO = (b"cannot reach postgresql://app:Hunter2Secret@db.example/x; password=KvPairSecret; "
        b"Authorization: Bearer BearerTokenSecret123")


def stored(state_dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(state_dsn) as conn:
        return conn.execute("SELECT status, last_error FROM cdc_pipeline.failed_messages").fetchall()


def test_last_error_is_masked_in_the_state_table(source_db, db_factory, write_config) -> None:
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    receiver = Receiver()
    receiver.behaviour = lambda h, b: (400, ECHO, 0.0) if b'"id": 2' in b or b'"id":2' in b else (200, b"{}", 0.0)
    data = mirror_config(source_db.dsn, db_factory().dsn, ["public.t"])
    data["sinks"] = [{"name": "hook", "tables": ["public.t"], "max_retries": 1,
                      "backoff": {"initial_ms": 2000, "max_ms": 2000, "jitter": 0},
                      "destination": {"type": "webhook", "url": receiver.url, "batch_size": 1}}]
    config = write_config(data)
    setup(config)
    cmd = [CLI, "--config", str(config.path), "deliver", "--sink", "hook", "--until-idle"]
    try:
        source_db.execute("INSERT INTO t VALUES (1), (2), (3)")
        drain(config)
        seen: list[str] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # parked by the first run, discarded by a run after the backoff
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            rows = stored(config.state_dsn)
            assert len(rows) == 1, rows
            seen.append(rows[0][0])
            status, error = rows[0]
            assert "HTTP 400" in error and "db.example" in error, error
            for secret in SECRETS:
                assert secret not in error, error
            if status == "discarded":
                break
        assert seen[0] == "parked" and seen[-1] == "discarded", seen
        assert len(receiver.acked_keys()) == 2
    finally:
        receiver.stop()
