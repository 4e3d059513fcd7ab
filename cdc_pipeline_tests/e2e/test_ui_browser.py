"""The Dagster UI itself, in a real browser (Debian's chromium through Playwright, installed by
scripts/bootstrap), on `dagster dev` with the project's dagster.yaml: a partition backfill launched from
the snapshot asset's page (its Materialize dialog) runs at most two partitions at once (the cdc_backfill
pool) and each partition's check reports its own backfill. (Retrying a parked message from the retry job's
Launchpad in the browser is not landed yet: cdc_pipeline_tests/e2e/test_failed_messages_dagster.py runs the
same job and check in process.)"""

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
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter
from psycopg import sql

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.demo.dagster_dev import DagsterDev, storage_url
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

