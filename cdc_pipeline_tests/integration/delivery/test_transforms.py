"""Filters, transforms, routing, grouping, message shape, poison pills and dry runs, end to end through
Spark: real inserts/updates/deletes on two tables -> real drain -> change log -> real Deliverer -> real
sinks (Postgres append tables, a Redis stream, a local HTTP server).

One workload is drained once per module; every sink has its own offset, so each test delivers its own
sink(s) over the same log and compares what arrived with the changes the workload made.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import yaml
from psycopg import sql

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.cli import main
from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.plan import SinkPlan, consumer_id
from cdc_pipeline.delivery.spark_stage import run_stage
from cdc_pipeline.state import relations
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline_tests.conftest import Database, _drop
from cdc_pipeline_tests.helpers import deliver, drain
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import REDIS_URL
from cdc_pipeline_tests.transforms_example import TIERS

TABLES = ["public.orders", "public.payments"]
EXAMPLE = "cdc_pipeline_tests.transforms_example"
FILTER = "record.amount > 100 AND action <> 'delete'"
DICT = {"id": "record.id", "total": "record.amount * 2", "kind": "action", "tbl": "metadata.table_name"}
SLOW = {"initial_ms": 600_000, "max_ms": 600_000, "jitter": 0}  # never due by itself during a test
FAST = {"initial_ms": 1, "max_ms": 2, "jitter": 0}
META_KEYS = {"table_schema", "table_name", "commit_timestamp", "commit_lsn", "commit_idx", "idempotency_key",
             "consumer", "backfill_id"}
DDL = """
CREATE TABLE orders (id int PRIMARY KEY, account_id int NOT NULL, amount numeric(12,2), status text);
CREATE TABLE payments (id int PRIMARY KEY, account_id int NOT NULL, amount numeric(12,2), method text);
ALTER TABLE orders REPLICA IDENTITY FULL;
ALTER TABLE payments REPLICA IDENTITY FULL;
"""


# -- the workload and its model ------------------------------------------------------------------------


@dataclass
class Change:
    table: str  # orders | payments
    action: str
    record: dict[str, Any]
    changes: dict[str, Any] | None
    pos: Position = (0, -1)  # (commit_lsn, commit_idx), filled in from the log after the drain

    @property
    def key(self) -> str:
        return f"{self.pos[0]}:{self.pos[1]}"

    @property
    def id(self) -> int:
        return int(self.record["id"])

    def raw(self) -> dict[str, Any]:
        return {"record": self.record, "changes": self.changes, "action": self.action}


class Workload:
    """Runs statements against the source and records, per row event, the change it must produce."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.rows: dict[str, dict[int, dict[str, Any]]] = {"orders": {}, "payments": {}}
        self.changes: list[Change] = []

    def tx(self, *ops: Callable[[psycopg.Connection], None]) -> None:
        with self.db.connect() as conn, conn.transaction():
            for op in ops:
                op(conn)

    def insert(self, table: str, **row: Any) -> Callable[[psycopg.Connection], None]:
        def run(conn: psycopg.Connection) -> None:
            conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, row)),
                sql.SQL(", ").join(sql.Placeholder() * len(row))), list(row.values()))
            self.rows[table][row["id"]] = dict(row)
            self.changes.append(Change(table, "insert", dict(row), None))
        return run

    def update(self, table: str, row_id: int, **values: Any) -> Callable[[psycopg.Connection], None]:
        def run(conn: psycopg.Connection) -> None:
            conn.execute(sql.SQL("UPDATE {} SET {} WHERE id = %s").format(
                sql.Identifier(table), sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(k))
                                                          for k in values)), [*values.values(), row_id])
            old = self.rows[table][row_id]
            new = {**old, **values}
            self.rows[table][row_id] = new
            # REPLICA IDENTITY FULL: `changes` holds the old values of exactly the changed columns.
            self.changes.append(Change(table, "update", new, {k: old[k] for k in values if old[k] != new[k]}))
        return run

    def delete(self, table: str, row_id: int) -> Callable[[psycopg.Connection], None]:
        def run(conn: psycopg.Connection) -> None:
            conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(table)), [row_id])
            self.changes.append(Change(table, "delete", self.rows[table].pop(row_id), None))
        return run


def run_workload(db: Database) -> list[Change]:
    w = Workload(db)
    o = "orders"
    w.tx(w.insert(o, id=1, account_id=10, amount=50, status="new"),
         w.insert(o, id=2, account_id=10, amount=150, status="new"),  # the webhook's poison key
         w.insert(o, id=3, account_id=20, amount=250, status="new"),
         w.insert(o, id=4, account_id=20, amount=99, status="new"),
         w.insert(o, id=5, account_id=30, amount=500, status="new"),
         w.insert(o, id=6, account_id=10, amount=101, status="new"))
    w.tx(w.insert("payments", id=1, account_id=10, amount=150, method="card"),
         w.insert("payments", id=2, account_id=20, amount=20, method="cash"),
         w.insert("payments", id=3, account_id=30, amount=300, method="card"))
    w.tx(w.update(o, 1, amount=120.5, status="paid"))  # now passes the filter
    w.tx(w.update(o, 2, status="paid"))
    w.tx(w.update(o, 3, amount=80))  # no longer passes the filter
    w.tx(w.delete(o, 5))  # amount 500, but a delete
    w.tx(w.update("payments", 1, amount=175.25))
    w.tx(w.delete("payments", 2))
    w.tx(w.update(o, 2, amount=151))
    w.tx(w.insert(o, id=7, account_id=20, amount=300, status="new"),
         w.update(o, 4, amount=200),
         w.insert(o, id=8, account_id=30, amount=None, status="draft"))  # a NULL amount
    return w.changes


# -- a local webhook receiver --------------------------------------------------------------------------


class Hooks:
    """HTTP server on 127.0.0.1 (port 0). POST /<sink> answers 500 when a message in the body matches that
    sink's rejection rule, else 200 and records the messages (arrival order)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rules: dict[str, Callable[[dict[str, Any]], bool]] = {}
        self.accepted: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.requests: dict[str, int] = defaultdict(int)
        self.single_rejections: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                sink = self.path.split("?")[0].strip("/")
                data = json.loads(body)["data"]
                with hooks.lock:
                    hooks.requests[sink] += 1
                    rule = hooks.rules.get(sink)
                    rejected = rule is not None and any(rule(m) for m in data)
                    if rejected and len(data) == 1:
                        hooks.single_rejections[sink][data[0]["metadata"]["idempotency_key"]] += 1
                    if not rejected:
                        hooks.accepted[sink].extend(data)
                status = 500 if rejected else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def keys(self, sink: str) -> list[str]:
        with self.lock:
            return [m["metadata"]["idempotency_key"] for m in self.accepted[sink]]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def orders_id(row_id: int, action: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def rule(m: dict[str, Any]) -> bool:
        return (m["metadata"]["table_name"] == "orders" and m["record"]["id"] == row_id
                and (action is None or m["action"] == action))
    return rule


# -- the module's world ---------------------------------------------------------------------------------


@dataclass
class World:
    config: PipelineConfig  # every sink below, default grouping
    grouped: PipelineConfig  # same source and log; orders grouped by account_id
    source: Database
    dest: Database
    hooks: Hooks
    changes: list[Change]
    prefix: str  # of the Redis streams this module creates
    t0: datetime
    t1: datetime
    spark: Any
    _delivered: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def appended(self, sink: str) -> list[dict[str, Any]]:
        """Deliver `sink` (a Postgres append sink) once; its messages in commit order."""
        if sink not in self._delivered:
            deliver(self.config, self.spark, sink)
            rows = self.dest.execute(f'SELECT message FROM out."{sink}" ORDER BY commit_lsn, commit_idx')
            self._delivered[sink] = [r[0] for r in rows]
        return self._delivered[sink]

    def source_rows(self, table: str) -> list[dict[str, Any]]:
        rows = self.source.execute(f'SELECT to_jsonb(t) FROM public."{table}" t')
        return [{k: float(v) if k == "amount" and v is not None else v for k, v in r[0].items()} for r in rows]

    def by_key(self) -> dict[str, Change]:
        return {c.key: c for c in self.changes}

    def offset(self, sink: str) -> Position | None:
        row = self.source.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.sink_offsets WHERE sink = %s",
                                  (sink,))
        return (int(row[0][0]), int(row[0][1])) if row else None

    def failed(self, sink: str) -> list[tuple[str, str, int, str]]:
        return [(f"{r[0]}:{r[1]}", r[2], r[3], r[4]) for r in self.source.execute(
            "SELECT commit_lsn, commit_idx, status, attempts, last_error FROM cdc_pipeline.failed_messages "
            "WHERE sink = %s ORDER BY commit_lsn, commit_idx", (sink,))]


def _append(dest: Database, name: str, **keys: Any) -> dict[str, Any]:
    return {"name": name, "tables": TABLES, **keys,
            "destination": {"type": "postgres", "dsn": dest.dsn, "table": f"out.{name}", "mode": "append"}}


def _hook(hooks: Hooks, name: str, **keys: Any) -> dict[str, Any]:
    return {"name": name, "tables": TABLES, **keys,
            "destination": {"type": "webhook", "url": f"{hooks.url}/{name}", "timeout_ms": 5000}}


@pytest.fixture(scope="module")
def world(pg_admin_dsn: str, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    made: list[str] = []

    def database() -> Database:
        db = Database(pg_admin_dsn, f"t_{uuid.uuid4().hex[:12]}")
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db.name)))
        made.append(db.name)
        return db

    hooks = Hooks()
    prefix = f"cdc_{uuid.uuid4().hex[:8]}_"
    try:
        source, dest = database(), database()
        source.execute(DDL)
        base = {"source": {"dsn": source.dsn, "slot": "cdc_tx", "publication": "cdc_tx"},
                "spark": {"master": "local[2]"},
                "drain": {"heartbeat_seconds": 1, "batch_ms": 200}}
        sinks = [
            _append(dest, "f_plain"),
            _append(dest, "f_filter", filter=FILTER),
            _append(dest, "f_actions", actions=["insert"]),
            _append(dest, "f_reads", actions=["delete"]),
            _append(dest, "f_dict", transform=DICT),
            _append(dest, "f_enrich", transform=f"{EXAMPLE}:enrich"),
            {**_append(dest, "f_udf", transform=f"{EXAMPLE}:label_udf"), "tables": ["public.payments"]},
            _append(dest, "f_failing", transform={"id": "record.id", "ratio": "100 / (record.id - 3)"},
                    backoff=SLOW),
            {"name": "f_route", "tables": TABLES, "route": f"concat('{prefix}', metadata.table_name)",
             "destination": {"type": "redis_stream", "url": REDIS_URL, "stream_key": f"{prefix}unrouted"}},
            _hook(hooks, "hook", backoff=SLOW),
            _hook(hooks, "hook3", max_retries=3, backoff=FAST),
            _hook(hooks, "f_dry", filter=FILTER, transform=DICT),
        ]
        grouped_sinks = [_hook(hooks, "g_acct", backoff=SLOW),
                         _hook(hooks, "g_off", backoff=SLOW, message_grouping=False)]
        folder = tmp_path_factory.mktemp("transforms")
        (folder / "cdc.yaml").write_text(yaml.safe_dump(
            {**base, "tables": [{"name": t} for t in TABLES], "sinks": sinks}, sort_keys=False))
        (folder / "grouped.yaml").write_text(yaml.safe_dump(
            {**base, "tables": [{"name": "public.orders", "group_columns": ["account_id"]},
                                {"name": "public.payments"}], "sinks": grouped_sinks}, sort_keys=False))
        config, grouped = load_config(folder / "cdc.yaml"), load_config(folder / "grouped.yaml")
        setup(config)
        t0 = datetime.now(UTC)
        changes = run_workload(source)
        t1 = datetime.now(UTC)
        drain(config)
        log = source.execute("SELECT commit_lsn, commit_idx, table_name, action, record FROM "
                             "cdc_pipeline.change_log ORDER BY commit_lsn, commit_idx")
        # The log holds exactly the workload's changes, in the order they were made.
        assert [(r[2], r[3], r[4]) for r in log] == [(c.table, c.action, c.record) for c in changes]
        for c, r in zip(changes, log, strict=True):
            c.pos = (int(r[0]), int(r[1]))
        yield World(config, grouped, source, dest, hooks, changes, prefix, t0, t1, spark)
    finally:
        hooks.stop()
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)
        client.close()
        for name in made:
            _drop(pg_admin_dsn, name)


def cli(*args: str) -> int:
    """The real CLI, in-process (it shares this process's SparkSession); restores the signal handlers
    that `deliver` installs."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return main(list(args))
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def assert_group_order(keys: list[str], changes: dict[str, Change], group: Callable[[Change], Any]) -> None:
    """Within each group, the arrival order is commit order (and nothing arrived twice)."""
    assert len(keys) == len(set(keys)), "duplicates"
    seen: dict[Any, list[Position]] = defaultdict(list)
    for k in keys:
        seen[group(changes[k])].append(changes[k].pos)
    for g, positions in seen.items():
        assert positions == sorted(positions), f"group {g}: arrived out of commit order: {positions}"


def by_pk(c: Change) -> tuple[str, int]:
    return c.table, c.id


# -- filters and transforms ------------------------------------------------------------------------------


def test_filter_delivers_exactly_the_matching_messages(world: World) -> None:
    got = world.appended("f_filter")
    amount = lambda c: c.record["amount"]  # noqa: E731
    want = [c for c in world.changes if c.action != "delete" and amount(c) is not None and amount(c) > 100]
    assert {(c.table, c.id, c.action) for c in want} >= {("orders", 1, "update"), ("orders", 7, "insert")}
    assert [m["metadata"]["idempotency_key"] for m in got] == [c.key for c in want]
    assert [{k: m[k] for k in ("record", "changes", "action")} for m in got] == [c.raw() for c in want]


def test_actions_insert_only(world: World) -> None:
    got = world.appended("f_actions")
    want = [c for c in world.changes if c.action == "insert"]
    assert len(want) < len(world.changes)
    assert [(m["metadata"]["idempotency_key"], m["action"], m["record"]) for m in got] == \
        [(c.key, "insert", c.record) for c in want]


def test_action_filter_always_passes_backfill_reads(world: World) -> None:
    # A backfill of payments (the real CLI, drain included) targets this sink only: its `read` messages
    # pass an action filter that names neither insert nor read.
    assert cli("--config", str(world.config.path), "backfill", "public.payments", "--sink", "f_reads", "--drain",
               "--quiet") == 0
    drain(world.config)
    got = world.appended("f_reads")
    deletes = [c for c in world.changes if c.action == "delete"]
    assert [m["metadata"]["idempotency_key"] for m in got[:len(deletes)]] == [c.key for c in deletes]
    reads = got[len(deletes):]
    assert [(m["action"], m["record"], m["changes"]) for m in reads] == \
        [("read", row, None) for row in sorted(world.source_rows("payments"), key=lambda r: r["id"])]
    (backfill_id,) = {m["metadata"]["backfill_id"] for m in reads}
    assert backfill_id and all(m["metadata"]["table_name"] == "payments" for m in reads)
    assert reads[0]["metadata"]["commit_lsn"] > world.changes[-1].pos[0]  # after every change


def test_dict_transform_payloads_have_exactly_the_fields(world: World) -> None:
    got = world.appended("f_dict")
    assert len(got) == len(world.changes)  # a transform filters nothing
    for m, c in zip(got, world.changes, strict=True):
        amount = c.record["amount"]
        want = {"id": c.id, "total": None if amount is None else amount * 2, "kind": c.action, "tbl": c.table}
        assert set(m) <= set(DICT), m  # nothing but the mapped fields (a NULL one: see test_null_values_...)
        assert {k: m.get(k) for k in DICT} == want


def test_python_transform_joins_a_static_dataframe(world: World) -> None:
    got = world.appended("f_enrich")
    tiers = dict(TIERS)
    assert len(got) == len(world.changes)
    for m, c in zip(got, world.changes, strict=True):
        assert {"record", "action", "metadata", "tier"} <= set(m) <= {"record", "changes", "action", "metadata",
                                                                    "tier"}
        assert m["tier"] == tiers.get(c.record["account_id"], "none")
        assert m["action"] == c.action and m["metadata"]["idempotency_key"] == c.key
        assert {k: m["record"].get(k) for k in c.record} == c.record
    assert {m["tier"] for m in got} == {"gold", "silver", "none"}


def test_python_transform_with_a_python_udf(world: World) -> None:
    # A Python UDF runs in Spark's Python workers: they must run this interpreter (with this project's
    # packages), not whatever `python3` comes first on PATH. (The sink reads one table: when the workers
    # are wrong, the engine bisects the batch down to single rows, one Spark job each.)
    stats = deliver(world.config, world.spark, "f_udf")
    parked = world.failed("f_udf")
    assert stats.parked == 0, f"{parked[0][3][:300]} (do Spark's Python workers run {sys.executable}?)"
    want = [c for c in world.changes if c.table == "payments"]
    rows = world.dest.execute("SELECT message FROM out.f_udf ORDER BY commit_lsn, commit_idx")
    assert [r[0]["label"] for r in rows] == [f"PAYMENTS#{c.id}" for c in want]
    assert [r[0]["metadata"]["idempotency_key"] for r in rows] == [c.key for c in want]


def test_expression_failing_on_one_message_parks_only_that_message(world: World) -> None:
    # `100 / (record.id - 3)` divides by zero (ANSI mode) for the rows with id 3 only (one per table):
    # those messages, and the later ones of their group, are parked with Spark's error; the rest of the
    # batch goes through.
    stats = deliver(world.config, world.spark, "f_failing")
    bad = [c for c in world.changes if c.id == 3]
    assert [(c.table, c.action) for c in bad] == [("orders", "insert"), ("payments", "insert"), ("orders", "update")]
    assert stats.parked == len(bad)
    parked = world.failed("f_failing")
    assert [(p[0], p[2]) for p in parked] == [(bad[0].key, 1), (bad[1].key, 1), (bad[2].key, 0)]
    assert "DIVIDE_BY_ZERO" in parked[0][3] and "DIVIDE_BY_ZERO" in parked[1][3] and "held" in parked[2][3]
    rows = world.dest.execute("SELECT idempotency_key, message FROM out.f_failing ORDER BY commit_lsn, commit_idx")
    good = [c for c in world.changes if c not in bad]
    assert [r[0] for r in rows] == [c.key for c in good]
    assert [r[1] for r in rows] == [{"id": c.id, "ratio": 100 / (c.id - 3)} for c in good]


# -- routing and grouping --------------------------------------------------------------------------------


def test_route_fans_out_one_stream_per_table_in_commit_order(world: World) -> None:
    stats = deliver(world.config, world.spark, "f_route")
    assert stats.delivered == len(world.changes)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert client.exists(f"{world.prefix}unrouted") == 0
        for table in ("orders", "payments"):
            entries = client.xrange(f"{world.prefix}{table}")
            want = [c for c in world.changes if c.table == table]
            assert [e[1][b"key"].decode() for e in entries] == [c.key for c in want]
            payloads = [json.loads(e[1][b"data"]) for e in entries]
            assert [{k: p[k] for k in ("record", "changes", "action")} for p in payloads] == [c.raw() for c in want]
            assert {p["metadata"]["table_name"] for p in payloads} == {table}
    finally:
        client.close()


def _stage(world: World, config: PipelineConfig, sink: str) -> dict[str, str | None]:
    """run_stage over the whole log for `sink`: idempotency key -> group_key."""
    change_log = ChangeLog("cdc_pipeline")
    with psycopg.connect(config.state_dsn) as conn:
        batch = change_log.load_batch(conn, TABLES, (0, -1), 10_000, sink=sink)  # (not other sinks' reads)
        schemas = relations.relation_columns(conn, "cdc_pipeline")
    out = run_stage(world.spark, SinkPlan.build(config, config.sink(sink)), batch, schemas).to_pylist()
    return {f"{r['commit_lsn']}:{r['commit_idx']}": r["group_key"] for r in out}


def test_stage_group_keys_for_group_columns_primary_key_and_off(world: World) -> None:
    groups = _stage(world, world.grouped, "g_acct")
    assert list(groups) == [c.key for c in world.changes]
    for c in world.changes:
        want = json.dumps([str(c.record["account_id"])]) if c.table == "orders" else f"public|payments|[{c.id}]"
        assert groups[c.key] == want.replace(" ", ""), c
    # Deletes group by the old row's account too.
    assert groups[next(c.key for c in world.changes if c.action == "delete" and c.table == "orders")] == '["30"]'
    default = _stage(world, world.config, "hook")
    assert all(default[c.key] == f"public|{c.table}|[{c.id}]" for c in world.changes)
    assert set(_stage(world, world.grouped, "g_off").values()) == {None}


def test_group_columns_hold_back_the_account_then_deliver_it_in_commit_order(world: World) -> None:
    # Order 3's update (account 20) is rejected until the flag flips. Grouped by account, every later
    # orders message of account 20 waits behind it; with grouping off, only the rejected message waits.
    changes, hooks = world.by_key(), world.hooks
    rejected = next(c for c in world.changes if c.table == "orders" and c.id == 3 and c.action == "update")
    held = [c for c in world.changes if c.table == "orders" and c.record["account_id"] == 20 and c.pos > rejected.pos]
    assert {c.id for c in held} == {4, 7}
    hooks.rules["g_acct"] = hooks.rules["g_off"] = orders_id(3, "update")

    acct = deliver(world.grouped, world.spark, "g_acct")
    off = deliver(world.grouped, world.spark, "g_off")
    assert acct.parked == 1 + len(held) and off.parked == 1
    assert set(hooks.keys("g_acct")) == {c.key for c in world.changes} - {c.key for c in [rejected, *held]}
    assert set(hooks.keys("g_off")) == {c.key for c in world.changes} - {rejected.key}
    account = lambda c: (c.table, c.record["account_id"]) if c.table == "orders" else by_pk(c)  # noqa: E731
    assert_group_order(hooks.keys("g_acct"), changes, account)
    for sink in ("g_acct", "g_off"):  # the offset moved past the whole log anyway
        assert world.offset(sink) == world.changes[-1].pos

    del hooks.rules["g_acct"], hooks.rules["g_off"]
    for sink in ("g_acct", "g_off"):
        assert cli("--config", str(world.grouped.path), "failed", "retry", "--all", "--sink", sink) == 0
    acct = deliver(world.grouped, world.spark, "g_acct")
    off = deliver(world.grouped, world.spark, "g_off")
    assert acct.retried == 1 + len(held) and off.retried == 1
    assert hooks.keys("g_acct")[-3:] == [c.key for c in [rejected, *held]]  # in commit order
    assert_group_order(hooks.keys("g_acct"), changes, account)
    assert hooks.keys("g_off")[-1] == rejected.key
    assert world.failed("g_acct") == [] and world.failed("g_off") == []


# -- message shape ---------------------------------------------------------------------------------------


def test_message_shape_and_stable_idempotency_keys(world: World) -> None:
    for sink in ("f_plain", "f_filter"):  # raw records, and records parsed for a filter
        got = world.appended(sink)
        changes = world.by_key()
        for m in got:
            c = changes[m["metadata"]["idempotency_key"]]
            assert set(m) == {"record", "changes", "action", "metadata"}
            assert m["record"] == c.record and m["changes"] == c.changes and m["action"] == c.action
            md = m["metadata"]
            # backfill_id is null for changes (its presence: see test_null_values_keep_their_keys)
            assert set(md) | {"backfill_id"} == META_KEYS and md.get("backfill_id") is None
            assert (md["table_schema"], md["table_name"]) == ("public", c.table)
            assert (md["commit_lsn"], md["commit_idx"]) == c.pos and md["idempotency_key"] == c.key
            assert md["consumer"] == {"id": consumer_id(sink), "name": sink}
            ts = datetime.fromisoformat(md["commit_timestamp"])
            assert ts.tzinfo is not None and world.t0 <= ts <= world.t1
        keys = [m["metadata"]["idempotency_key"] for m in got]
        assert len(set(keys)) == len(keys)
    # One transaction, one commit timestamp.
    first_tx = [m for m in world.appended("f_plain") if m["metadata"]["commit_lsn"] == world.changes[0].pos[0]]
    assert len(first_tx) == 6 and len({m["metadata"]["commit_timestamp"] for m in first_tx}) == 1
    # Re-running the stage on the same log rows gives the same keys and bytes.
    change_log = ChangeLog("cdc_pipeline")
    for sink in ("f_plain", "f_filter"):
        with psycopg.connect(world.config.state_dsn) as conn:
            batch = change_log.load_batch(conn, TABLES, (0, -1), 10_000, sink=sink)
            schemas = relations.relation_columns(conn, "cdc_pipeline")
        plan = SinkPlan.build(world.config, world.config.sink(sink))
        first, again = (run_stage(world.spark, plan, batch, schemas).to_pylist() for _ in range(2))
        assert first == again
        assert [json.loads(r["payload"])["metadata"]["idempotency_key"] for r in first] == \
            [m["metadata"]["idempotency_key"] for m in world.appended(sink)]


def test_null_values_keep_their_keys(world: World) -> None:
    # A NULL is a value: `metadata.backfill_id` of a change, a mapped field whose expression is NULL,
    # `changes` of an insert in a Python transform's output all stay in the JSON as null.
    for m in world.appended("f_plain"):
        assert "backfill_id" in m["metadata"] and m["metadata"]["backfill_id"] is None
    draft = next(c for c in world.changes if c.table == "orders" and c.id == 8)
    dicts = {m["id"]: m for m in world.appended("f_dict") if m["tbl"] == "orders" and m["kind"] == "insert"}
    assert dicts[8] == {"id": 8, "total": None, "kind": "insert", "tbl": "orders"}
    enriched = [m for m in world.appended("f_enrich") if m["metadata"]["idempotency_key"] == draft.key]
    assert enriched[0]["changes"] is None and "changes" in enriched[0]
    assert enriched[0]["record"] == draft.record  # amount: null kept


# -- webhook poison pill -----------------------------------------------------------------------------------


def test_webhook_poison_key_parked_others_on_time_then_delivered_in_order(world: World) -> None:
    hooks, changes = world.hooks, world.by_key()
    poison = [c for c in world.changes if c.table == "orders" and c.id == 2]
    assert len(poison) == 3
    hooks.rules["hook"] = orders_id(2)

    stats = deliver(world.config, world.spark, "hook")
    assert stats.parked == len(poison)
    # Every other key arrived in this first run, each in commit order; the offset passed the whole log.
    assert set(hooks.keys("hook")) == {c.key for c in world.changes} - {c.key for c in poison}
    assert_group_order(hooks.keys("hook"), changes, by_pk)
    assert world.offset("hook") == world.changes[-1].pos
    parked = world.failed("hook")
    assert [(p[0], p[1]) for p in parked] == [(c.key, "parked") for c in poison]
    assert parked[0][2] == 1 and [p[2] for p in parked[1:]] == [0, 0]  # the head failed; the rest held

    deliver(world.config, world.spark, "hook")  # not due yet (long backoff): nothing moves
    assert not set(hooks.keys("hook")) & {c.key for c in poison}

    del hooks.rules["hook"]  # the endpoint recovers
    assert cli("--config", str(world.config.path), "failed", "retry", "--all", "--sink", "hook") == 0
    stats = deliver(world.config, world.spark, "hook")
    assert stats.retried == len(poison)
    assert hooks.keys("hook")[-3:] == [c.key for c in poison]  # in commit order, after the rest
    assert_group_order(hooks.keys("hook"), changes, by_pk)
    assert world.failed("hook") == []


def test_webhook_poison_key_discarded_after_max_retries(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    hooks = world.hooks
    poison = [c for c in world.changes if c.table == "orders" and c.id == 2]
    hooks.rules["hook3"] = orders_id(2)  # never recovers
    for _ in range(30):  # backoff of 1-2 ms: every run retries what is parked
        deliver(world.config, world.spark, "hook3")
        if all(p[1] == "discarded" for p in world.failed("hook3")):
            break
    failed = world.failed("hook3")
    assert [(p[0], p[1]) for p in failed] == [(c.key, "discarded") for c in poison]
    assert all("gave up after 3 retries" in p[3] for p in failed), failed
    # Each message was tried once, then retried max_retries = 3 times, never accepted.
    assert {k: n for k, n in hooks.single_rejections["hook3"].items()} == {c.key: 4 for c in poison}
    assert set(hooks.keys("hook3")) == {c.key for c in world.changes} - {c.key for c in poison}

    capsys.readouterr()
    assert cli("--config", str(world.config.path), "failed", "list", "--sink", "hook3", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(i["id"], i["status"]) for i in listed] == [(c.key, "discarded") for c in poison]


# -- dry run ------------------------------------------------------------------------------------------------


def test_dry_run_writes_what_would_be_sent_and_touches_nothing(world: World, tmp_path: Path) -> None:
    out = tmp_path / "dry.jsonl"
    before = world.offset("f_dry")
    assert cli("--config", str(world.config.path), "deliver", "--sink", "f_dry", "--dry-run", "--until-idle",
               "--output", str(out)) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    amount = lambda c: c.record["amount"]  # noqa: E731
    want = [c for c in world.changes if c.action != "delete" and amount(c) is not None and amount(c) > 100]
    assert lines == [{"id": c.id, "total": amount(c) * 2, "kind": c.action, "tbl": c.table} for c in want]
    assert world.hooks.requests["f_dry"] == 0  # the endpoint never heard of it
    assert before in (None, (0, -1)) and world.offset("f_dry") in (None, (0, -1))  # never moved
    assert world.failed("f_dry") == []
