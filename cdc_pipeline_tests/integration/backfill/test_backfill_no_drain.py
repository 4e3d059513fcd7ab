"""A backfill never waits in silence (issue 8.2): while its staged pages wait and no process consumes the
slot (`pg_replication_slots.active` is false), every progress line, `cdc-pipeline status` and the backfill's
metadata say so and name the fix; once a drain runs, the warning goes and the backfill completes."""

from __future__ import annotations

import json
import threading

from cdc_pipeline.admin import status
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest, Progress
from cdc_pipeline.cli import main as cli_main
from cdc_pipeline_tests.integration.backfill.test_backfill import (
    backfill_config,
    drain_running,
    log_reads,
    wait_for,
)

FIXES = ("cdc-pipeline drain", "--drain", "cdc_drain_sensor")


def test_waiting_without_a_drain_is_reported_everywhere(source_db, db_factory, write_config, capsys) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 40) g")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.t"],
                                          {"initial_page_size": 10, "max_page_size": 10, "max_staged_pages": 1}))
    setup(config)
    lines: list[str] = []
    snapshots: list[dict[str, object]] = []

    def record(progress: Progress) -> None:
        lines.append(progress.line())
        snapshots.append(progress.as_metadata())

    runner = Backfiller(config, BackfillRequest("public.t"), on_progress=record, progress_seconds=0.2)
    result: list[Progress] = []
    thread = threading.Thread(target=lambda: result.append(runner.run()), daemon=True)
    thread.start()
    try:
        # No drain: the first page is staged and waits; after the grace period every line says why.
        wait_for(lambda: any("WARNING" in line for line in lines), timeout=30, what="the no-drain warning")
        warned_at = next(i for i, line in enumerate(lines) if "WARNING" in line)
        wait_for(lambda: len(lines) >= warned_at + 3, timeout=10, what="more progress lines")
        for line in lines[warned_at:]:
            assert "no process is consuming slot 'cdc_test'" in line, line
            assert all(fix in line for fix in FIXES), line
        warning = snapshots[-1]["drain_warning"]
        assert isinstance(warning, str) and "pg_replication_slots.active is false" in warning
        assert all(fix in warning for fix in FIXES)

        # status, as data and as text (the CLI)
        collected = status.collect(config)
        assert collected["slot"]["active"] is False
        [info] = collected["backfills"]
        assert all(fix in info["drain_warning"] for fix in FIXES), info
        assert cli_main(["--config", str(config.path), "status"]) == 0
        out = capsys.readouterr().out
        backfill_line = next(line for line in out.splitlines() if line.startswith("backfill "))
        assert "WARNING" in backfill_line and all(fix in backfill_line for fix in FIXES), out
        assert "no process is consuming it" in out
        assert cli_main(["--config", str(config.path), "status", "--json"]) == 0
        as_json = json.loads(capsys.readouterr().out)
        assert "cdc-pipeline drain" in as_json["backfills"][0]["drain_warning"]

        # A drain starts: the backfill completes and the warning is gone.
        with drain_running(config):
            thread.join(120)
        assert not thread.is_alive()
    finally:
        runner.stop()
        thread.join(30)
    assert result and result[0].status == "completed"
    assert result[0].drain_warning == "" and result[0].as_metadata()["drain_warning"] == ""
    assert "WARNING" not in lines[-1], lines[-1]
    assert len(log_reads(config)) == 40
    assert status.collect(config)["backfills"][0]["drain_warning"] == ""
