""""One delivery run per sink": while one `deliver --sink S` process is in the middle of sending a batch, a
second one for the same sink sends nothing and exits non-zero naming the other process; once the first has
exited, the next run delivers. Observed at a real webhook receiver, through the real CLI."""

from __future__ import annotations

import subprocess
import threading
from collections import Counter

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import drain, mirror_config, wait_until
from cdc_pipeline_tests.integration.admin.test_cli_errors import CLI
from cdc_pipeline_tests.integration.sinks.test_sink_webhook import Receiver


def test_a_second_deliver_of_the_same_sink_sends_nothing(source_db, db_factory, write_config) -> None:
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    receiver = Receiver()
    arrived: list[int] = []
    release = threading.Event()

    def first_blocks(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        arrived.append(1)
        if len(arrived) == 1:
            release.wait(300)
        return 200, b"{}", 0.0

    receiver.behaviour = first_blocks
    data = mirror_config(source_db.dsn, db_factory().dsn, ["public.t"])
    data["sinks"] = [{"name": "hook", "tables": ["public.t"],
                      "destination": {"type": "webhook", "url": receiver.url, "timeout_ms": 300000}}]
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 20) g")
    drain(config)
    cmd = [CLI, "--config", str(config.path), "deliver", "--sink", "hook", "--until-idle"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: arrived, what="the first run's request")
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert second.returncode != 0, second.stdout + second.stderr
        assert "already being delivered by another process" in second.stderr, second.stderr
        assert len(arrived) == 1, "the second run sent while the first was delivering"
    finally:
        release.set()
        out, err = first.communicate(timeout=300)
    try:
        assert first.returncode == 0, out + err
        keys = Counter(receiver.acked_keys())
        assert len(keys) == 20 and set(keys.values()) == {1}, keys

        # The first run has exited, so its lock is free: the next run delivers the new change.
        source_db.execute("INSERT INTO t VALUES (21, 'b')")
        drain(config)
        third = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert third.returncode == 0, third.stdout + third.stderr
        assert len(receiver.acked_keys()) == 21
    finally:
        receiver.stop()
