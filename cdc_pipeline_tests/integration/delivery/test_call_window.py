"""The engine's window across calls (issue 23) through `cdc-pipeline deliver`, against a real HTTP endpoint:
with the sink's own `batch_size: 1` every message is a call of its own, and `max_in_flight` of them are
out at once, across micro-batches. A poison message in the middle of the full window parks only its group
(its later versions held behind it), every other group arrives complete and in commit order, the window
never holds more than its width, and the offset ends at the log's end."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from cdc_pipeline.admin import status
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests import helpers
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.integration.admin.test_cli_errors import CLI
from cdc_pipeline_tests.integration.delivery.test_delivery_outage import _config, _failed, _log
from cdc_pipeline_tests.integration.sinks.test_webhook_window import Counting

ROWS = 60
WINDOW = 20
POISON = 13


def _three_versions(source_db: Database, write_config: Callable[..., PipelineConfig], url: str
                    ) -> tuple[PipelineConfig, list[tuple[str, int]]]:
    """A sink of calls of one message (its own `batch_size: 1`), a window of WINDOW; ROWS rows inserted then
    updated twice, drained: the config and the log (key, row)."""
    config = _config(source_db, write_config, url, batch_size=1, destination={"max_in_flight": WINDOW})
    source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, %s) g", (ROWS,))
    source_db.execute("UPDATE t SET v = 1")
    source_db.execute("UPDATE t SET v = 2")
    helpers.drain(config)
    return config, _log(config)


def test_calls_of_one_message_fill_the_window_and_isolate_a_poison_message(
        source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    receiver = Counting()
    lock = threading.Lock()
    versions: dict[int, list[int]] = {}  # row -> versions acknowledged, in arrival order

    def behaviour(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        (m,) = json.loads(body)["data"]  # one message per request: calls of one
        row, v = m["record"]["id"], m["record"]["v"]
        if row == POISON and v >= 1:
            return receiver.hold(500, b"cannot process this one", fill=WINDOW)
        answer = receiver.hold(200, b"{}", fill=WINDOW)  # until WINDOW requests were out at once
        with lock:
            versions.setdefault(row, []).append(v)
        return answer

    receiver.behaviour = behaviour
    try:
        config, log = _three_versions(source_db, write_config, receiver.url)
        assert len(log) == 3 * ROWS

        done = subprocess.run([CLI, "--config", str(config.path), "deliver", "--sink", "hook", "--until-idle"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        receiver.stop()

    assert receiver.peak == WINDOW  # the window filled across calls, and never went past its width
    for row in range(1, ROWS + 1):  # every group complete and in commit order; the poison one up to it
        assert versions.get(row) == ([0] if row == POISON else [0, 1, 2]), (row, versions.get(row))
    failed = _failed(config)
    # the poison version parked with its error (retried meanwhile: backoff 50 ms), the next one held behind it
    assert [(r, s) for r, s, _, _ in failed] == [(POISON, "parked"), (POISON, "parked")], failed
    assert failed[0][2] >= 1 and failed[1][2] == 0, failed
    assert "HTTP 500" in failed[0][3] and "held behind" in failed[1][3]
    with psycopg.connect(config.state_dsn) as conn:
        offset = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.sink_offsets "
                              "WHERE sink = 'hook'").fetchone()
    assert f"{offset[0]}:{offset[1]}" == log[-1][0]
    sink: dict[str, Any] = status.collect(config)["sinks"]["hook"]
    assert sink["parked"] == 2 and sink["lag_messages"] == 0, sink


def test_one_call_refused_as_if_the_endpoint_were_down_beside_calls_that_get_through_is_parked(
        source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    """A 503 speaks for the whole endpoint, but the calls out beside it were acknowledged after it began: the
    endpoint is up, so that call's message went unanswered (parked, not counted, its group held behind it),
    not an outage that would end `deliver --until-idle` with an error (one call at a time, it would be)."""
    receiver = Counting()
    refused: list[bytes] = []

    def behaviour(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        if [(m["record"]["id"], m["record"]["v"]) for m in json.loads(body)["data"]] == [(POISON, 1)] and not refused:
            refused.append(body)
            return 503, b"busy", 0.0
        return 200, b"{}", 0.02

    receiver.behaviour = behaviour
    try:
        config, log = _three_versions(source_db, write_config, receiver.url)
        cmd = [CLI, "--config", str(config.path), "deliver", "--sink", "hook", "--until-idle"]
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stdout + first.stderr
        assert refused and '"outage_retries": 0' in first.stdout, first.stdout
        row_of = dict(log)
        poison = [k for k, r in log if r == POISON]
        got = [k for k in dict.fromkeys(receiver.acked_keys()) if row_of[k] == POISON]
        # in order, up to what is still parked (retries 50 ms later may have come before the run ended)
        assert got == poison[:len(got)] and got, got
        assert [(r, s) for r, s, _, _ in _failed(config)] == [(POISON, "parked")] * (len(poison) - len(got))
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # retries what is parked
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        receiver.stop()
    acked = receiver.acked_keys()
    assert set(acked) == set(row_of)
    for row in range(1, ROWS + 1):  # each row's first acknowledgements in commit order
        mine = [k for k, r in log if r == row]
        assert [k for k in dict.fromkeys(acked) if row_of[k] == row] == mine, row
    assert _failed(config) == []
