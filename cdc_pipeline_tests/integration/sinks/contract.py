"""The sink contract suite's parts (test_contract.py runs them): what a sink type's fixture hands the suite,
and the pipeline every contract test drives, from a real source table to the real destination.

A sink type joins the suite with one fixture in this folder's conftest.py, decorated `@contract_sink`,
returning a `SinkUnderTest` (docs/how-to/write-a-sink.md, "Join the contract suite").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database

GROUPS = 4  # rows are grouped by `g = id % GROUPS`
POISON = 7  # the row a sink's `poison` makes its destination refuse
TEXT = "naïve café №{} ✓ \"q\" \\ \u2028"  # each row's text: bytes a sink must carry unchanged


class Got(NamedTuple):
    """One message as the destination holds it."""

    message: dict[str, Any]  # the message JSON, parsed
    key: str | None = None  # the destination's own id of it (a header, a field, a column), if it keeps one
    headers: dict[str, str] = {}  # noqa: RUF012 - read only


@dataclass
class SinkUnderTest:
    """What a sink type's fixture hands the suite. Every callable reads or acts on the real destination."""

    destination: Callable[[], dict[str, Any]]  # the sink's `destination:` (through a proxy where it has an outage)
    received: Callable[[], list[Got]] = list  # what the destination holds, in its own order (see `ordered`)
    # A mirror (`@contract_sink(mirror=True)`) keeps each row's latest state, not the messages: the rows it
    # holds, by `id`, as {"g": .., "v": ..}; the suite compares them with the source (`received` is not used).
    state: Callable[[], dict[int, dict[str, Any]]] | None = None
    # Edits the sink's cdc.yaml entry so that row POISON's messages fail at the destination, alone.
    poison: Callable[[dict[str, Any]], None] | None = None
    outage: Callable[[], AbstractContextManager[None]] | None = None  # the destination down while entered
    unreachable: Callable[[], dict[str, Any]] | None = None  # a destination nothing answers at (may hold a secret)
    secret: str | None = None  # in `unreachable`'s destination: never in an error
    headers: Callable[[dict[str, Any]], dict[str, str]] = lambda m: {}  # the headers a message must carry
    ordered: bool = True  # `received` is the order the destination took messages in
    sink: dict[str, Any] = field(default_factory=dict)  # further keys of the sink's cdc.yaml entry


def pipeline(source_db: Database, write_config: Callable[..., PipelineConfig], sut: SinkUnderTest,
             poisoned: bool = False, grouped: bool = True, **sink: Any) -> PipelineConfig:
    """A source table `t (id, g, v)` grouped by `g` (else by its key, `id`: no Spark work, so a `deliver`
    process starts no JVM), one sink `s` of the type under test; set up."""
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, g int NOT NULL, v text NOT NULL)")
    source_db.execute("ALTER TABLE t REPLICA IDENTITY FULL")  # group_columns beyond the key
    entry = {"name": "s", "tables": ["public.t"], "max_retries": 0, "destination": sut.destination(),
             **sut.sink, **sink}
    if poisoned:
        assert sut.poison is not None
        entry["backoff"] = {"initial_ms": 600_000, "max_ms": 600_000, "jitter": 0}  # parked, not retried here
        entry["max_retries"] = None
        sut.poison(entry)
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "contract", "publication": "contract"},
        "spark": {"master": "local[2]"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 100},
        "delivery": {"idle_seconds": 0.05, "retry_initial_ms": 100, "retry_max_ms": 500},
        "tables": [{"name": "public.t", **({"group_columns": ["g"]} if grouped else {})}],
        "sinks": [entry],
    })
    setup(config)
    return config


def write(source_db: Database, first: int, last: int, updates: int = 1) -> None:
    """Rows first..last inserted, then each updated `updates` times, each statement its own transaction."""
    source_db.execute(f"INSERT INTO t SELECT i, mod(i, {GROUPS}), format(%s, i) FROM generate_series(%s::int, %s::int) i",
                      (TEXT.replace("{}", "%s"), first, last))
    for _ in range(updates):
        source_db.execute("UPDATE t SET v = v || '+' WHERE id BETWEEN %s AND %s", (first, last))


class Logged(NamedTuple):
    key: str
    id: int
    group: int


def logged(config: PipelineConfig) -> list[Logged]:
    """Every change in the log, in commit order."""
    with psycopg.connect(config.state_dsn) as conn:
        return [Logged(f"{lsn}:{idx}", int(row), int(row) % GROUPS) for lsn, idx, row in conn.execute(
            "SELECT commit_lsn, commit_idx, record->>'id' FROM cdc_pipeline.change_log ORDER BY 1, 2")]


def failed(config: PipelineConfig) -> list[tuple[str, str, str]]:
    """(key, status, last error) of every parked or discarded message, in log order."""
    with psycopg.connect(config.state_dsn) as conn:
        return [(f"{lsn}:{idx}", status, error) for lsn, idx, status, error in conn.execute(
            "SELECT commit_lsn, commit_idx, status, last_error FROM cdc_pipeline.failed_messages ORDER BY 1, 2")]


def settled(config: PipelineConfig) -> int:
    """Messages the sink's offset has moved past (its `delivered` figure)."""
    with psycopg.connect(config.state_dsn) as conn:
        row = conn.execute("SELECT sum(delivered) FROM cdc_pipeline.sink_offsets WHERE sink = 's'").fetchone()
        return int(row[0] or 0) if row else 0


def source_rows(source_db: Database) -> dict[int, dict[str, Any]]:
    """The source table's rows, by `id`, as a mirror's `state` gives them."""
    with psycopg.connect(source_db.dsn) as conn:
        return {i: {"g": g, "v": v} for i, g, v in conn.execute("SELECT id, g, v FROM t")}


def applied(config: PipelineConfig, without: Collection[str] = ()) -> dict[int, dict[str, Any]]:
    """The rows a mirror holds once every logged change but those keyed in `without` was applied, in order."""
    rows: dict[int, dict[str, Any]] = {}
    with psycopg.connect(config.state_dsn) as conn:
        for lsn, idx, action, record in conn.execute(
                "SELECT commit_lsn, commit_idx, action, record FROM cdc_pipeline.change_log ORDER BY 1, 2"):
            if f"{lsn}:{idx}" in without:
                continue
            if action == "delete":
                rows.pop(int(record["id"]), None)
            else:
                rows[int(record["id"])] = {"g": record["g"], "v": record["v"]}
    return rows


def holds_every_change(sut: SinkUnderTest, config: PipelineConfig) -> bool:
    """Every logged change reached the destination: each message (at least once), or a mirror's every row."""
    if sut.state is not None:
        return sut.state() == applied(config)
    return set(keys(sut.received())) >= {e.key for e in logged(config)}


def keys(got: list[Got]) -> list[str]:
    return [g.message["metadata"]["idempotency_key"] for g in got]


def first_seen(got: list[Got]) -> list[str]:
    """Idempotency keys in the order each first arrived (a redelivery after a crash repeats some)."""
    return list(dict.fromkeys(keys(got)))


def in_group_order(got: list[Got], log: list[Logged], by_key: bool = False) -> None:
    """Each group's messages arrived in commit order (first arrivals); `by_key`: grouped by `id`."""
    arrived = first_seen(got)
    for group in {e.id if by_key else e.group for e in log}:
        mine = {e.key for e in log if (e.id if by_key else e.group) == group}
        assert [k for k in arrived if k in mine] == [e.key for e in log if e.key in mine], f"group {group}"


def parse(payload: bytes | str) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(payload)
    return message

