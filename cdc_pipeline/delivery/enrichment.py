"""Enrichment: one query per batch against the source adds columns from other tables to each message.

After Sequin's shape: the sink's `enrichment: {table, sql}` query takes `$1` (and `$2`, ... for a composite
key): arrays of the batch's primary key values of `table`, one per key column in key order. It selects
the key columns and the columns to add, at most one row per key. Each message of that table gets the
row (as `to_jsonb` gives it, key columns included) as `metadata.enrichment`; a key without a row gets
null, and messages of the sink's other tables have no such key. The query runs when the batch is staged,
in a read-only session with a statement timeout: what it reads is the state after the change. A failing
query is an outage of the source (`EnrichmentUnavailable`, waited for), never a message's failure.

The join is done here on the Arrow batch (an `enrichment` column), before either stage: both then splice
the same text into the metadata, so the Spark and Arrow paths give the same bytes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from cdc_pipeline.config import EnrichmentConfig, SinkConfig, redact
from cdc_pipeline.core.findings import Finding
from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.catalog import TableInfo
from cdc_pipeline.sinks.base import SinkUnavailable

log = logging.getLogger(__name__)

APP_NAME = "cdc_pipeline.enrichment"


class EnrichmentUnavailable(SinkUnavailable):
    """The enrichment query failed (source down, timeout, a broken query): the batch waits."""


# -- pure parts -------------------------------------------------------------------------------------

def _canonical(value: object) -> str:
    """One text per JSON value, equal for the log's key and the query's column (numbers by their digits)."""
    if isinstance(value, Decimal | int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def key_of(values: Sequence[object]) -> tuple[str, ...]:
    return tuple(_canonical(v) for v in values)


def _element(value: object) -> str:
    """A value as an element of a PostgreSQL array literal (always quoted)."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, Decimal | int | float):
        text = str(value)
    else:
        text = json.dumps(value, separators=(",", ":"))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def key_params(keys: Sequence[Sequence[object]], width: int) -> list[str]:
    """`$1..$width`: one array literal per key column, of the distinct keys in order."""
    return ["{" + ",".join(_element(k[i]) for k in keys) + "}" for i in range(width)]


def batch_keys(batch: pa.Table, table: str, width: int) -> tuple[list[int], list[list[object]]]:
    """(row indexes of `table` with a key, their key values) of a log batch."""
    schema, _, name = table.partition(".")
    rows: list[int] = []
    keys: list[list[object]] = []
    mask = pc.and_(pc.equal(batch.column("table_schema"), schema), pc.equal(batch.column("table_name"), name))
    for i in pc.indices_nonzero(mask).to_pylist():
        pk = batch.column("pk")[i].as_py()
        if pk is None:
            continue
        values = json.loads(pk, parse_float=Decimal)
        if isinstance(values, list) and len(values) == width:
            rows.append(i)
            keys.append(values)
    return rows, keys


def joined(n: int, rows: Sequence[int], keys: Sequence[Sequence[object]], found: dict[tuple[str, ...], str]
           ) -> pa.Array:
    """The `enrichment` column: the found row's JSON for each keyed row of the table, "null" for a key without
    one, and null (spliced as no key at all) for every other row."""
    out: list[str | None] = [None] * n
    for i, k in zip(rows, keys, strict=True):
        out[i] = found.get(key_of(k), "null")
    return pa.array(out, pa.string())


# -- the query --------------------------------------------------------------------------------------

def _wrapped(query: str) -> str:
    return f"SELECT to_jsonb(e)::text FROM ({query}) e"  # the operator's query, as configured


def _connect(dsn: str, timeout_ms: int) -> psycopg.Connection:
    conn = session.connect(dsn, autocommit=True, statement_timeout_ms=timeout_ms, application_name=APP_NAME,
                           cursor_factory=psycopg.RawCursor)  # $1-style parameters, as configured
    conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    conn.execute("SET TimeZone = 'UTC'")  # timestamps render as the drain logs them
    return conn


def query_columns(conn: psycopg.Connection, cfg: EnrichmentConfig, width: int) -> list[str]:
    """The query's column names, run on empty keys (for `check`); raises psycopg.Error if it fails."""
    cur = conn.cursor()  # a RawCursor (_connect)
    cur.execute(f"SELECT * FROM ({cfg.sql}) e LIMIT 0", ["{}"] * width)
    return [d.name for d in cur.description or []]


class Enricher:
    def __init__(self, dsn: str, cfg: EnrichmentConfig, key_columns: Callable[[str], tuple[str, ...]]) -> None:
        self.dsn = dsn
        self.cfg = cfg
        self.key_columns = key_columns
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()  # batches are staged ahead on a second thread

    def enrich(self, batch: pa.Table) -> pa.Table:
        """The batch with an `enrichment` column (see the module doc)."""
        columns = self.key_columns(self.cfg.table)
        rows, keys = batch_keys(batch, self.cfg.table, len(columns)) if columns else ([], [])
        found = self._query(columns, keys) if keys else {}
        return batch.append_column("enrichment", joined(batch.num_rows, rows, keys, found))

    def _query(self, columns: Sequence[str], keys: list[list[object]]) -> dict[tuple[str, ...], str]:
        distinct = list({key_of(k): k for k in keys}.values())
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = _connect(self.dsn, self.cfg.statement_timeout_ms)
                # Each query its own read-only transaction: the session's default is not enough, since a
                # query may change it (set_config is no write) for the queries after it.
                with self._conn.transaction():
                    self._conn.execute("SET TRANSACTION READ ONLY")
                    texts = [r[0] for r in self._conn.execute(_wrapped(self.cfg.sql),
                                                              key_params(distinct, len(columns))).fetchall()]
            except psycopg.Error as exc:
                self.close()
                raise EnrichmentUnavailable(f"enrichment query of {self.cfg.table} failed: "
                                            f"{redact(' '.join(str(exc).split()))[:300]}") from exc
        found: dict[tuple[str, ...], str] = {}
        for text in texts:
            row = json.loads(text, parse_float=Decimal)
            if not all(c in row for c in columns):
                raise EnrichmentUnavailable(f"enrichment query of {self.cfg.table} must select its key columns "
                                            f"({', '.join(columns)})")
            found.setdefault(key_of([row[c] for c in columns]), text)  # several rows of a key: the first (documented)
        return found

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def check_enrichment(sinks: Sequence[SinkConfig], dsn: str, described: Mapping[str, TableInfo]) -> list[Finding]:
    """`check`: each enrichment query runs on the source (read-only, empty keys) and selects its table's key."""
    out: list[Finding] = []
    for sink in sinks:
        cfg = sink.enrichment
        if cfg is None:
            continue
        subject = f"sink {sink.name} enrichment"
        info = described.get(cfg.table)
        if info is None or not info.primary_key:
            out.append(Finding("error", subject, f"{cfg.table} has no primary key to pass as $1"))
            continue
        try:
            with _connect(dsn, cfg.statement_timeout_ms) as conn:
                names = query_columns(conn, cfg, len(info.primary_key))
        except psycopg.Error as exc:
            out.append(Finding("error", subject, f"the query fails on the source: "
                                                 f"{redact(' '.join(str(exc).split()))[:300]}"))
            continue
        missing = [c for c in info.primary_key if c not in names]
        if missing:
            out.append(Finding("error", subject, f"the query must select the key columns of {cfg.table}: "
                                                 f"missing {', '.join(missing)}"))
        elif len(set(names)) != len(names):
            out.append(Finding("error", subject, "the query selects a column name twice"))
        else:
            out.append(Finding("ok", subject, f"adds {', '.join(c for c in names if c not in info.primary_key)}"))
    return out
