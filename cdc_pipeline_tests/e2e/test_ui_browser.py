"""The Dagster UI itself, in a real browser (Debian's chromium through Playwright, installed by
scripts/bootstrap), on `dagster dev` with the project's dagster.yaml: a partition backfill launched from
the snapshot asset's page (its Materialize dialog) runs at most two partitions at once (the cdc_backfill
pool) and each partition's check reports its own backfill; a message the mirror rejects is parked, listed
by the sink's `no_stale_parked_messages` check, and delivered once the retry job is launched from its
Launchpad with the message's ID in the run config. One `dagster dev` for the module."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import yaml
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter
from psycopg import sql

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.defs.health import PARKED_CHECK
from cdc_pipeline.demo.dagster_dev import LOCATION, DagsterDev, storage_url
from cdc_pipeline_tests.conftest import Database, _drop
from cdc_pipeline_tests.helpers import mirror_config, wait_until

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SNAPSHOT = AssetKey(["cdc", "snapshot", "public", "orders_snapshot"])
SINK = AssetKey(["sink", "mirror"])
DAYS = ["2025-01-01", "2025-01-02", "2025-01-03"]


@dataclass(frozen=True)
class Ui:
    dev: DagsterDev
    instance: DagsterInstance
    source: Database
    dest: Database
    state_dsn: str


@pytest.fixture(scope="module")
def ui(pg_admin_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    tmp_path = tmp_path_factory.mktemp("dagster_ui")
    names = [f"t_{uuid.uuid4().hex[:12]}" for _ in range(3)]
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    source, dest, storage = (Database(pg_admin_dsn, name) for name in names)
    try:
        source.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, updated_at timestamptz "
                       "NOT NULL); INSERT INTO orders SELECT g, 'paid', '2025-01-01'::timestamptz + g * interval "
                       "'1 minute' FROM generate_series(1, 4000) g")  # ~2.8 days
        dest.execute("CREATE SCHEMA mirror; CREATE TABLE mirror.orders (id bigint PRIMARY KEY, status text, "
                     "updated_at timestamptz, CONSTRAINT poison CHECK (status <> 'poison'))")
        data = mirror_config(source.dsn, dest.dsn, [{"name": "public.orders", "sort_column": "updated_at",
                                                     "partitions": {"kind": "daily", "start": DAYS[0],
                                                                    "end": "2025-01-04"}}],
                             backoff={"initial_ms": 900000, "max_ms": 900000, "jitter": 0})  # retried by the job, not on its own
        (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        from cdc_pipeline.config import load_config

        config = load_config(tmp_path / "cdc.yaml")
        setup(config)
        home = tmp_path / "dagster_home"
        with pytest.MonkeyPatch.context() as mp, open(tmp_path / "dagster.log", "wb") as log:
            mp.setenv("DAGSTER_PG_URL", storage_url(storage.dsn))
            with DagsterDev(home, tmp_path / "cdc.yaml", storage.dsn, log=log) as dev:
                dev.wait_loaded()
                with DagsterInstance.from_config(str(home)) as instance:
                    yield Ui(dev, instance, source, dest, config.state_dsn)
    finally:
        for name in names:
            _drop(pg_admin_dsn, name)


@pytest.fixture
def page(ui: Ui) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def _open(page: Any, ui: Ui, path: str) -> None:
    page.goto(f"http://127.0.0.1:{ui.dev.port}{path}", wait_until="load")
    skip = page.get_by_role("button", name="Skip")  # Dagster's first-visit newsletter dialog
    with contextlib.suppress(Exception):  # not shown this time
        skip.first.click(timeout=8000)


def _backfill_runs(instance: DagsterInstance) -> list[Any]:
    return [r for r in instance.get_runs(RunsFilter(tags={"dagster/backfill": list_backfill_ids(instance)}))]


def list_backfill_ids(instance: DagsterInstance) -> list[str]:
    return [b.backfill_id for b in instance.get_backfills()]


def test_partition_backfill_from_the_asset_page(ui: Ui, page: Any) -> None:
    _open(page, ui, "/assets/" + "/".join(SNAPSHOT.path))
    page.get_by_role("button", name="Materialize…").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="All", exact=True).click()  # the table's three daily partitions
    dialog.get_by_role("button", name="Launch backfill").click()
    wait_until(lambda: len(_backfill_runs(ui.instance)) >= 1, 120, "the backfill's first run")
    most = 0
    deadline = time.monotonic() + 600
    while True:  # the pool: never more than two of its runs at once
        runs = _backfill_runs(ui.instance)
        most = max(most, sum(r.status in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED) for r in runs))
        if len(runs) == len(DAYS) and all(r.is_finished for r in runs):
            break
        assert time.monotonic() < deadline, [(r.run_id, r.status) for r in runs]
        time.sleep(0.5)
    assert 1 <= most <= 2, most
    assert all(r.status == DagsterRunStatus.SUCCESS for r in runs), [(r.job_name, r.status) for r in runs]
    for run in runs:  # each partition's check reports that run's own backfill and partition
        partition = run.tags["dagster/partition"]
        [check] = [e.dagster_event.asset_check_evaluation_data for e in ui.instance.all_logs(run.run_id)
                   if e.dagster_event is not None and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
        assert check.passed and check.metadata["partition"].value == partition
        assert check.metadata["backfill_id"].value == run.tags["cdc_pipeline/backfill_id"]
        assert check.metadata["dagster_run_id"].value == run.run_id



def _parked_rows(ui: Ui) -> list[Any]:
    """The parked messages as the sink's check lists them (its latest evaluation's table)."""
    key = AssetCheckKey(SINK, PARKED_CHECK)
    record = ui.instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)
    event = record.event.dagster_event if record is not None and record.event is not None else None
    if event is None or event.event_type_value != "ASSET_CHECK_EVALUATION":
        return []
    table = event.asset_check_evaluation_data.metadata.get("parked_messages")
    return list(table.value.records) if table is not None else []


def test_parked_message_retried_from_the_launchpad(ui: Ui, page: Any) -> None:
    ui.source.execute("UPDATE orders SET status = 'poison' WHERE id = 2")  # the mirror rejects it
    wait_until(lambda: _parked_rows(ui), 180, "the parked message in the check's table")
    [row] = _parked_rows(ui)
    assert row.data["table"] == "public.orders" and "poison" in row.data["error"], row.data
    ui.dest.execute("ALTER TABLE mirror.orders DROP CONSTRAINT poison")  # the cause fixed
    _open(page, ui, f"/locations/{LOCATION}/jobs/retry_failed_messages_mirror/playground")
    editor = page.locator(".CodeMirror").first
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(f"ops: {{retry_failed_mirror: {{config: {{ids: ['{row.data['id']}']}}}}}}")
    page.get_by_role("button", name="Launch Run").click()
    page.wait_for_url("**/runs/**")
    run_id = page.url.rstrip("/").split("/runs/")[1].split("?")[0]
    wait_until(lambda: ui.instance.get_run_by_id(run_id).is_finished, 120, "the retry run")
    assert ui.instance.get_run_by_id(run_id).status == DagsterRunStatus.SUCCESS
    wait_until(lambda: ui.dest.execute("SELECT status FROM mirror.orders WHERE id = 2") == [("poison",)], 120,
               "the retried message delivered")
