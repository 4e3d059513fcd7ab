"""The Dagster UI itself, in a real browser (Debian's chromium through Playwright, installed by
scripts/bootstrap), and its GraphQL API as the UI calls it, on `dagster dev` with the project's dagster.yaml:
partition backfills launched from the snapshot asset's page (its Materialize dialog) and through the API
run at most two partitions at once (the cdc_backfill pool) and each partition's check reports its own
backfill; messages the mirror rejects are parked, listed by the sink's `no_stale_parked_messages` check,
and delivered once the retry job is launched from its Launchpad (and by the API's launchRun) with the
message's ID in the run config; the caught-up sink reads as synced. One `dagster dev` for the module."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.error
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
CUSTOMERS = AssetKey(["cdc", "snapshot", "public", "customers_snapshot"])
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
                       "'1 minute' FROM generate_series(1, 4000) g; "  # ~2.8 days
                       "CREATE TABLE customers (id bigint PRIMARY KEY, created_at timestamptz NOT NULL); INSERT "
                       "INTO customers SELECT g, '2025-01-01'::timestamptz + g * interval '1 hour' "
                       "FROM generate_series(1, 40) g")
        dest.execute("CREATE SCHEMA mirror; CREATE TABLE mirror.orders (id bigint PRIMARY KEY, status text, "
                     "updated_at timestamptz, CONSTRAINT poison CHECK (status <> 'poison')); "
                     "CREATE TABLE mirror.customers (id bigint PRIMARY KEY, created_at timestamptz)")
        daily = {"kind": "daily", "start": DAYS[0], "end": "2025-01-04"}
        data = mirror_config(source.dsn, dest.dsn, [
            {"name": "public.orders", "sort_column": "updated_at", "partitions": daily},
            {"name": "public.customers", "sort_column": "created_at", "partitions": daily}],
                             backoff={"initial_ms": 900000, "max_ms": 900000, "jitter": 0})  # retried by the job, not on its own
        # Materializations every 5 s, not 60: the sink's state (synced, metadata) is read within the test.
        data["drain"]["report_seconds"] = 5
        # max_lag_seconds 6: a sink blocked that long reads "Unsynced" within the test.
        data["delivery"] = {"report_seconds": 5, "max_lag_seconds": 6}
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
                # Runs terminated while dagster dev still runs: stopped with them alive, its process group
                # lingered until DagsterDev.stop's 20 s kill.
                dev.cancel_runs(["cdc_drain_sensor", "cdc_delivery_sensor"])
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


def _latest_metadata(ui: Ui, key: AssetKey) -> dict[str, Any]:
    [record] = ui.instance.fetch_materializations(key, limit=1).records
    return dict(record.asset_materialization.metadata)


def _backfill_runs(instance: DagsterInstance, backfill_ids: list[str] | None = None) -> list[Any]:
    ids = backfill_ids if backfill_ids is not None else [b.backfill_id for b in instance.get_backfills()]
    return list(instance.get_runs(RunsFilter(tags={"dagster/backfill": ids}))) if ids else []


def _watch(ui: Ui, count: int, backfill_ids: list[str] | None = None) -> tuple[list[Any], int]:
    """Until the backfill's `count` runs ended: the runs, and the most that were starting or running at once."""
    most = 0
    deadline = time.monotonic() + 600
    while True:
        runs = _backfill_runs(ui.instance, backfill_ids)
        most = max(most, sum(r.status in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED) for r in runs))
        if len(runs) == count and all(r.is_finished for r in runs):
            return runs, most
        assert time.monotonic() < deadline, [(r.run_id, r.status) for r in runs]
        time.sleep(0.5)


LAUNCH_BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
CHECK_EXECUTIONS = """query($k: AssetKeyInput!, $c: String!, $p: String) {
  assetCheckExecutions(assetKey: $k, checkName: $c, partition: $p, limit: 5) {
    runId status partition evaluation { success partition metadataEntries { label
      ... on TextMetadataEntry { text } } } } }"""


def _gql(ui: Ui, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        answer = ui.dev.graphql(query, variables)
    except urllib.error.HTTPError as exc:  # GraphQL's errors come with a 500 at times: show them
        raise AssertionError(exc.read().decode(errors="replace")) from None
    assert not answer.get("errors"), answer["errors"]
    return answer["data"]  # type: ignore[no-any-return]


def test_partition_backfills_from_the_asset_page_and_the_graphql_api(ui: Ui, page: Any) -> None:
    """Three partitions of orders launched from the snapshot asset's Materialize dialog, and at once a range of
    two partitions of customers through the GraphQL mutation that dialog sends (an asset selection and the
    range's keys; no tag of ours on its runs): the five runs share the cdc_backfill pool, never more than two
    at once, and each run's backfill_completed check reports its own run's backfill and partition."""
    _open(page, ui, "/assets/" + "/".join(SNAPSHOT.path))
    page.get_by_role("button", name="Materialize…").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="All", exact=True).click()  # the table's three daily partitions
    dialog.get_by_role("button", name="Launch backfill").click()
    launched = _gql(ui, LAUNCH_BACKFILL, {"p": {
        "assetSelection": [{"path": CUSTOMERS.path}], "partitionNames": DAYS[:2], "fromFailure": False,
        "tags": []}})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    runs, most = _watch(ui, len(DAYS) + 2)
    assert 1 <= most <= 2, most
    assert all(r.status == DagsterRunStatus.SUCCESS for r in runs), [(r.job_name, r.status) for r in runs]
    by_api = [r for r in runs if r.tags["dagster/backfill"] == launched["backfillId"]]
    assert sorted(r.tags["dagster/partition"] for r in by_api) == DAYS[:2]
    for run in runs:  # each partition's check reports that run's own backfill and partition
        partition = run.tags["dagster/partition"]
        [check] = [e.dagster_event.asset_check_evaluation_data for e in ui.instance.all_logs(run.run_id)
                   if e.dagster_event is not None and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
        assert check.passed and check.metadata["partition"].value == partition
        assert check.metadata["backfill_id"].value == run.tags["cdc_pipeline/backfill_id"]
        assert check.metadata["dagster_run_id"].value == run.run_id
    for run in by_api:  # the same, as the UI reads a partition's check executions
        partition = run.tags["dagster/partition"]
        executions = _gql(ui, CHECK_EXECUTIONS, {"k": {"path": CUSTOMERS.path}, "c": "backfill_completed",
                                                  "p": partition})["assetCheckExecutions"]
        [own] = [e for e in executions if e["runId"] == run.run_id]
        assert own["status"] == "SUCCEEDED" and own["evaluation"]["partition"] == partition, own
        entries = {m["label"]: m.get("text") for m in own["evaluation"]["metadataEntries"]}
        assert entries["partition"] == partition and entries["backfill_id"] == run.tags["cdc_pipeline/backfill_id"]
    snapshot = _latest_metadata(ui, SNAPSHOT)  # what the UI's table views read
    assert [c.name for c in snapshot["dagster/column_schema"].value.columns] == ["id", "status", "updated_at"]
    assert snapshot["dagster/row_count"].value > 0


def _parked_rows(ui: Ui) -> list[Any]:
    """The parked messages as the sink's check lists them (its latest evaluation's table)."""
    key = AssetCheckKey(SINK, PARKED_CHECK)
    record = ui.instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)
    event = record.event.dagster_event if record is not None and record.event is not None else None
    if event is None or event.event_type_value != "ASSET_CHECK_EVALUATION":
        return []
    table = event.asset_check_evaluation_data.metadata.get("parked_messages")
    return list(table.value.records) if table is not None else []


LAUNCH_RUN = """mutation($e: ExecutionParams!) { launchRun(executionParams: $e) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
STALE = """query($k: [AssetKeyInput!]) { assetNodes(assetKeys: $k) { staleStatus staleCauses { reason } } }"""


def _retry_config(message_id: str) -> dict[str, Any]:
    return {"ops": {"retry_failed_mirror": {"config": {"ids": [message_id]}}}}


def _finished(ui: Ui, run_id: str) -> Any:
    wait_until(lambda: ui.instance.get_run_by_id(run_id).is_finished, 120, f"run {run_id}")
    return ui.instance.get_run_by_id(run_id)


def test_parked_messages_retried_from_the_launchpad_and_the_api(ui: Ui, page: Any) -> None:
    """Two rows the mirror rejects: one retried from the retry job's Launchpad in the browser, the other by
    the GraphQL launchRun the Launchpad sends, each with the message's ID from the check's table. Then the
    sink, caught up, reads as synced (not "Unsynced")."""
    ui.source.execute("UPDATE orders SET status = 'poison' WHERE id IN (2, 3)")
    wait_until(lambda: len(_parked_rows(ui)) == 2, 180, "the parked messages in the check's table")
    rows = _parked_rows(ui)
    assert {r.data["table"] for r in rows} == {"public.orders"} and all("poison" in r.data["error"] for r in rows)
    ui.dest.execute("ALTER TABLE mirror.orders DROP CONSTRAINT poison")  # the cause fixed
    launched = _gql(ui, LAUNCH_RUN, {"e": {
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                     "jobName": "retry_failed_messages_mirror"}, "runConfigData": _retry_config(rows[1].data["id"])}})
    assert launched["launchRun"]["__typename"] == "LaunchRunSuccess", launched
    by_api = launched["launchRun"]["run"]["runId"]
    _open(page, ui, f"/locations/{LOCATION}/jobs/retry_failed_messages_mirror/playground")
    page.locator(".CodeMirror").first.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(yaml.safe_dump(_retry_config(rows[0].data["id"]), default_flow_style=True).strip())
    page.get_by_role("button", name="Launch Run").click()
    page.wait_for_url("**/runs/**")
    from_ui = page.url.rstrip("/").split("/runs/")[1].split("?")[0]
    for run_id in (from_ui, by_api):
        assert _finished(ui, run_id).status == DagsterRunStatus.SUCCESS
    wait_until(lambda: ui.dest.execute("SELECT count(*) FROM mirror.orders WHERE status = 'poison'") == [(2,)],
               120, "both retried messages delivered")
    wait_until(lambda: not _parked_rows(ui), 60, "the check's table emptied")
    wait_until(lambda: ui.instance.fetch_materializations(SINK, limit=1).records, 60, "the sink's materialization")
    wait_until(lambda: _stale_status(ui) == "FRESH", 30, "the caught-up sink to read synced")
    sink = _latest_metadata(ui, SINK)  # positions in PostgreSQL's notation, no empty values
    assert "/" in sink["offset"].value and sink["offset"].value == sink["offset_lsn"].value
    assert all(getattr(v, "value", v) not in (None, "", "None") for v in sink.values()), sink
    assert "dagster/column_schema" not in sink  # two tables: no one table's columns


def _stale_status(ui: Ui) -> str:
    """The sink's staleStatus as the UI reads it: FRESH, or STALE (the UI's "Unsynced")."""
    return str(_gql(ui, STALE, {"k": [{"path": SINK.path}]})["assetNodes"][0]["staleStatus"])


class Writer(threading.Thread):
    """An order every 50 ms until stopped, so the change log records a new materialization every 5 s."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stopped, self.error = dsn, threading.Event(), None
        self.start()

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stopped.wait(0.05):
                    conn.execute("INSERT INTO orders SELECT coalesce(max(id), 0) + 1, 'paid', now() FROM orders")
        except BaseException as exc:  # the test asserts there was none
            self.error = exc


def _check_run(ui: Ui) -> Any:
    """The run of the sink's lag_below_max check's newest record, as the UI shows the check."""
    key = AssetCheckKey(SINK, "lag_below_max")
    record = ui.instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)
    return None if record is None else ui.instance.get_run_by_id(record.run_id)


def test_the_sink_reads_synced_while_it_keeps_up_and_unsynced_while_behind(ui: Ui) -> None:
    """While rows arrive and the change log records materializations, the sink reads FRESH at every read
    of the UI's staleStatus (not "Unsynced" after each of the log's records); blocked (its table locked)
    longer than delivery.max_lag_seconds it reads STALE; released, FRESH again. Meanwhile lag_below_max is
    executed by hand as the Checks tab's Execute launches it, and the delivery run, seeing that record newer
    than its own, asks for a fresh run to hand over to (whose readings will be the check's latest again)."""
    log_key = AssetKey(["cdc", "change_log"])
    writer = Writer(ui.source.dsn)
    try:
        wait_until(lambda: _check_run(ui) is not None and _check_run(ui).job_name == "deliver_mirror", 120,
                   "the delivery run's reading of lag_below_max")
        wait_until(lambda: _stale_status(ui) == "FRESH", 60, "the sink to read synced")
        first = ui.instance.fetch_materializations(log_key, limit=1).records[0].storage_id
        seen: set[str] = set()
        recorded: list[float] = []

        def read_past_the_logs_next_record() -> bool:  # the sink read until 3 s after the log's next record
            seen.add(_stale_status(ui))
            if not recorded and ui.instance.fetch_materializations(log_key, limit=1).records[0].storage_id > first:
                recorded.append(time.monotonic())  # before: the sink read "Unsynced" from here to its own next
            return bool(recorded) and time.monotonic() - recorded[0] >= 3

        wait_until(read_past_the_logs_next_record, 60, "the change log's next materialization")
        assert seen == {"FRESH"}, seen
        streaming = _check_run(ui).run_id
        executed = _gql(ui, LAUNCH_RUN, {"e": {"selector": {
            "repositoryLocationName": LOCATION, "repositoryName": "__repository__", "jobName": "__ASSET_JOB",
            "assetSelection": [], "assetCheckSelection": [{"assetKey": {"path": SINK.path}, "name": "lag_below_max"}]},
            "mode": "default"}})["launchRun"]
        assert executed["__typename"] == "LaunchRunSuccess", executed
        with psycopg.connect(ui.dest.dsn) as conn:
            conn.execute("LOCK TABLE mirror.orders IN ACCESS EXCLUSIVE MODE")
            wait_until(lambda: _stale_status(ui) == "STALE", 60, "the blocked sink to read Unsynced")
        wait_until(lambda: _stale_status(ui) == "FRESH", 60, "the released sink to read synced again")
        # The delivery run saw the hand-executed record and asked for its successor (taking over is the
        # handover every run makes near its end; unit/test_dagster_handover.py has the rest).
        by_hand = executed["run"]["runId"]
        wait_until(lambda: by_hand in ui.instance.get_run_by_id(streaming).tags.get("cdc_pipeline/handover", ""),
                   120, "the delivery run to hand over")
        assert writer.error is None
    finally:
        writer.stopped.set()
        writer.join(10)


SNAPSHOT_NODE = """query($k: [AssetKeyInput!]) { assetNodes(assetKeys: $k) { description
  metadataEntries { label ... on TextMetadataEntry { text } } partitionStats { numPartitions } } }"""


def test_snapshot_assets_say_that_a_backfill_is_on_demand(ui: Ui) -> None:
    """What the snapshot asset's page shows beside "Missing (N)": that no backfill asked is no work left."""
    [node] = _gql(ui, SNAPSHOT_NODE, {"k": [{"path": SNAPSHOT.path}]})["assetNodes"]
    assert node["description"].startswith("On demand: a backfill of public.orders"), node
    assert "a missing partition is a day nobody asked to read again, not work left to do" in node["description"]
    entries = {e["label"]: e.get("text") for e in node["metadataEntries"]}
    assert entries["backfill"].startswith("on demand: the table's changes stream through cdc/change_log"), entries
    assert node["partitionStats"]["numPartitions"] == len(DAYS)
