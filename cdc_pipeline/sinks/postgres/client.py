"""Postgres sink: `mirror` keeps a table equal to the source; `append` writes one row per message.

A batch is COPYed into a temp stage table and applied set-wise, in one transaction that also records
the sink's position in the destination (`cdc_pipeline_sink.offsets`), so a crash between this commit
and the state database's offset commit is not redelivered.

Mirror: a table's messages are cut at each TRUNCATE and schema change; each segment is applied set-wise by
merge.py (JSON messages) or typed.py (backfill reads as composite text).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import psycopg
from psycopg import sql

from cdc_pipeline.core.findings import Finding
from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.catalog import TableInfo
from cdc_pipeline.postgres.compose import execute
from cdc_pipeline.postgres.keyset import parse_qualified
from cdc_pipeline.sinks.base import OutboundMessage, Sink, SinkConfigLike, SinkUnavailable
from cdc_pipeline.sinks.postgres import evolve, history, merge, typed
from cdc_pipeline.sinks.postgres.grants import grant_findings
from cdc_pipeline.sinks.postgres.own_position import OwnPosition
from cdc_pipeline.sinks.routes import route_problem
from cdc_pipeline.state.typed_log import RunRows, TypedRun

STAGE_WORK_MEM = "128MB"  # per sort/hash of one batch, for this transaction only
_TRANSIENT = (psycopg.OperationalError, psycopg.errors.ConnectionTimeout)
_REJECTED = (psycopg.Error, typed.TypedMismatch, evolve.SchemaFollowError)  # a failure of the messages applied, not of the sink


class _RunMismatch(Exception):
    """The relayed run is not the one announced (the log changed under it): applied by no one."""


class PostgresSink(Sink):
    def __init__(self, sink_config: object) -> None:
        self.name = sink_config.name  # type: ignore[attr-defined]
        self._own = self.own_position = OwnPosition(self)  # its own record of its position (own_position.py)
        self.dest = sink_config.destination  # type: ignore[attr-defined]
        self.mode: str = self.dest.mode
        self.holds_rows = self.mode == "mirror"
        self.typed_runs = self.deliver_typed_run if self.holds_rows else None  # typed reads, as they are
        self.conn: psycopg.Connection | None = None
        # target table -> the source columns it was synced to, and the mirror table's own description
        self._shapes: dict[str, tuple[tuple[str, ...], TableInfo]] = {}
        self._pending: dict[str, tuple[tuple[str, ...], TableInfo]] = {}  # synced in the open transaction
        self._position: tuple[int, int] = (0, -1)  # of the batch being applied
        self._plain = typed.PlainInserts()  # runs of typed reads into an empty key range: INSERT, no MERGE

    # -- capabilities (sinks/base.py): a mirror acts on truncates and writes the source's values, typed ----
    @classmethod
    def takes_truncates(cls, sink_config: SinkConfigLike) -> bool:
        return bool(sink_config.destination.mode == "mirror")

    @classmethod
    def takes_texts(cls, sink_config: SinkConfigLike) -> bool:
        return cls.takes_truncates(sink_config)

    @classmethod
    def takes_typed_rows(cls, sink_config: SinkConfigLike) -> bool:
        return cls.takes_truncates(sink_config)  # as they are: sinks/postgres/typed.py

    @classmethod
    def destination_tables(cls, sink_config: SinkConfigLike) -> list[str]:
        pattern = sink_config.destination.table
        return sorted({pattern.replace("{schema}", t.partition(".")[0]).replace("{table}", t.partition(".")[2])
                       for t in sink_config.tables})

    @classmethod
    def check_findings(cls, sink_config: SinkConfigLike) -> list[Finding]:
        return grant_findings(sink_config)

    # -- lifecycle --------------------------------------------------------------------------------
    def open(self) -> None:
        try:
            self.conn = session.connect(self.dest.dsn, application_name=f"cdc_pipeline sink {self.name}")
        except psycopg.OperationalError as exc:
            raise SinkUnavailable(f"postgres sink {self.name!r}: cannot connect ({type(exc).__name__})") from exc
        self._ddl_lock()
        OwnPosition.create(self.conn)
        self.conn.execute(
            "CREATE TEMP TABLE IF NOT EXISTS _cdc_stage (seq integer, lsn bigint, idx integer, grp text, "
            "route text, msg jsonb) ON COMMIT DELETE ROWS"
        )
        self.conn.execute(typed.STAGE_DDL)
        self.conn.commit()

    def _ddl_lock(self) -> None:
        """Sinks sharing a destination (`deliver` runs them at once) create schemas and tables one at a time:
        CREATE ... IF NOT EXISTS is not safe against a concurrent CREATE (a unique violation)."""
        assert self.conn is not None
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('cdc_pipeline sink ddl'))")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # -- delivery ---------------------------------------------------------------------------------
    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        """The batch in one transaction; if the destination rejects it, message by message up to the
        first one it rejects, the results ending there (the engine hands back what may follow)."""
        if not batch:
            return []
        try:
            bad = next((i for i, m in enumerate(batch) if self._route_problem(m)), len(batch))
            try:
                if bad:
                    self._apply(batch[:bad])
            except _REJECTED as exc:
                if isinstance(exc, _TRANSIENT):
                    raise
                assert self.conn is not None
                self.conn.rollback()
                self._shapes.clear()  # tables created in the rolled-back transaction are gone
                return self._up_to_first_failure(batch)
            if bad == len(batch):
                return [None] * len(batch)
            return [*([None] * bad), self._route_problem(batch[bad])]
        except _TRANSIENT as exc:
            raise SinkUnavailable(f"postgres sink {self.name!r}: {type(exc).__name__}: {exc}") from exc

    def deliver_typed_run(self, run: TypedRun, relayed: RunRows) -> str | None:
        """A run of typed reads relayed from the log (state/typed_log.py), in one transaction with the position
        of its last read. None: applied; an error: rejected, nothing applied (the engine then delivers the run
        message by message). Raises SinkUnavailable when the destination is unreachable."""
        assert self.conn is not None and self.mode == "mirror"
        try:
            with self._tracked():
                conn = self._begin()
                self._position = run.last  # the reads are one position's: no schema change among them
                copied, plain = self._copy_run(conn, run, relayed)
                if not copied:
                    with relayed.staged() as blocks:
                        rows = typed.stage_copy(conn, blocks)
                    self._check_count(run, rows)
                    if len(run.shapes) == 1:
                        typed.apply_one_shape(conn, rows, run.tables, run.shapes[0], self._sync_table, plain)
                    else:
                        self._mirror(rows, list(run.shapes))
                self._record(run.last)
        except _TRANSIENT as exc:
            raise SinkUnavailable(f"postgres sink {self.name!r}: {type(exc).__name__}: {exc}") from exc
        except (*_REJECTED, _RunMismatch) as exc:
            self.conn.rollback()
            self._shapes.clear()  # tables created in the rolled-back transaction are gone
            return f"{type(exc).__name__}: {str(exc).strip()[:500]}"
        return None

    def _copy_run(self, conn: psycopg.Connection, run: TypedRun, relayed: RunRows) -> tuple[bool, typed.PlainInserts | None]:
        """One table's run of one shape COPYed straight into its mirror table, where the plain INSERT would
        write it (typed.copy_run: an empty key range, no key twice). (Whether it was, how a run that was not is
        applied: INSERT where allowed, else MERGE; a copy that fell back leaves it to the MERGE.)"""
        if len(run.shapes) != 1 or len(run.tables) != 1:
            return False, self._plain
        (schema, name), columns = run.tables[0], run.shapes[0]
        target, info = self._sync_table(f"{schema}.{name}")
        if not typed.copyable(info, columns, schema, name):
            return False, self._plain
        if not (self._plain.wanted(target) and typed.unique_on_key(conn, target, info.primary_key)):
            return False, None
        with relayed.composite() as blocks:
            rows = typed.copy_run(conn, target, columns, blocks)
        if rows is None:  # a key there or twice: the log is read again for the MERGE
            self._plain.fell_back(target)
            return False, None
        self._check_count(run, rows)
        return True, None

    @staticmethod
    def _check_count(run: TypedRun, rows: int) -> None:
        if rows != run.count:
            raise _RunMismatch(f"typed run: {run.count} reads expected, {rows} relayed")

    def _up_to_first_failure(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        """Apply one message per transaction until the destination rejects one."""
        results: list[str | None] = []
        for m in batch:
            error = self._route_problem(m)
            if error is None:
                try:
                    self._apply([m])
                except _REJECTED as exc:
                    if isinstance(exc, _TRANSIENT):
                        raise
                    error = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
                    self._shapes.clear()  # as above: a table this message created was rolled back with it
            results.append(error)
            if error is not None:
                break
        return results

    def _apply(self, batch: Sequence[OutboundMessage]) -> None:
        with self._tracked():
            self._apply_in_tx(batch)

    @contextlib.contextmanager
    def _tracked(self) -> Iterator[None]:
        """A transaction whose table syncs are remembered only once it commits: a rolled-back CREATE or
        ALTER must be done again by the next transaction."""
        assert self.conn is not None
        self._pending = {}
        try:
            with self.conn.transaction():
                yield
        finally:
            pending, self._pending = self._pending, {}
        self._shapes.update(pending)  # reached only when the transaction committed

    def _apply_in_tx(self, batch: Sequence[OutboundMessage]) -> None:
        conn = self._begin()
        last = (0, -1)
        rows = [(seq, m.typed) for seq, m in enumerate(batch) if m.typed is not None]
        if rows and self.mode != "mirror":
            raise ValueError(f"postgres sink {self.name!r}: typed rows reach only a mirror")
        first: tuple[int, int] | None = None
        with conn.cursor().copy("COPY _cdc_stage (seq, lsn, idx, grp, route, msg) FROM STDIN") as copy:
            for seq, m in enumerate(batch):
                lsn, _, idx = m.key.partition(":")
                pos = (int(lsn), int(idx))
                last = max(last, pos)
                first = pos if first is None else min(first, pos)
                if m.typed is None:
                    copy.write_row((seq, pos[0], pos[1], m.group, m.route, m.payload.decode()))
        shapes = typed.stage(conn, rows) if rows else []
        self._position = first or (0, -1)
        if self.mode == "append":
            self._append()
        else:
            self._mirror(len(batch), shapes)
        self._record(last)

    def _begin(self) -> psycopg.Connection:
        assert self.conn is not None
        self.conn.execute("TRUNCATE _cdc_stage, _cdc_typed")
        # The mirror sorts a batch's effects by key with their records: in memory, not in temp files.
        self.conn.execute(f"SET LOCAL work_mem = '{STAGE_WORK_MEM}'")
        return self.conn

    def _record(self, last: tuple[int, int]) -> None:
        assert self.conn is not None
        self._own.record(self.conn, last)

    def _route_problem(self, m: OutboundMessage) -> str | None:
        return route_problem(m.route, getattr(self.dest, "route_schemas", None)) if self.mode == "append" else None

    # -- append -----------------------------------------------------------------------------------
    def _append(self) -> None:
        assert self.conn is not None
        routes = [r[0] for r in self.conn.execute("SELECT DISTINCT route FROM _cdc_stage").fetchall()]
        for route in routes:
            target = parse_qualified(route or self.dest.table)
            ident = sql.Identifier(*target)
            self._ddl_lock()
            self.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(target[0])))
            self.conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (idempotency_key text PRIMARY KEY, commit_lsn bigint NOT NULL, "
                "commit_idx integer NOT NULL, table_schema text, table_name text, action text, "
                "message jsonb NOT NULL, delivered_at timestamptz NOT NULL DEFAULT now())").format(ident))
            execute(self.conn, sql.SQL(
                "INSERT INTO {} (idempotency_key, commit_lsn, commit_idx, table_schema, table_name, action, message) "
                "SELECT lsn || ':' || idx, lsn, idx, msg->'metadata'->>'table_schema', "
                "msg->'metadata'->>'table_name', msg->>'action', msg FROM _cdc_stage "
                "WHERE route IS NOT DISTINCT FROM %s ORDER BY seq ON CONFLICT (idempotency_key) DO NOTHING"
            ).format(ident), (route,))

    # -- mirror -----------------------------------------------------------------------------------
    def _target(self, source_table: str) -> tuple[str, str]:
        schema, _, table = source_table.partition(".")
        return parse_qualified(self.dest.table.format(schema=schema, table=table))

    def _sync_table(self, source_table: str) -> tuple[tuple[str, str], TableInfo]:
        """Create the mirror table if missing (with the columns the source had at this position: history.py),
        add the columns the source's latest description has and the mirror lacks; returns the mirror table's
        own description (its columns are what a message is written to). Columns leave a mirror only by a
        `schema` message at their position (evolve.py), never because a later description lacks them."""
        assert self.conn is not None
        info = self.context.describe(source_table)
        if info is None or not info.primary_key:
            raise ValueError(f"mirror of {source_table}: no primary key known for the source table")
        target = self._target(source_table)
        columns = (*(c.name for c in info.columns), *(f"{g.name} AS ({g.expression})" for g in info.generated))
        key = ".".join(target)
        known = self._pending.get(key, self._shapes.get(key))
        if known is not None and known[0] == columns:
            return target, known[1]
        ident = sql.Identifier(*target)
        self._ddl_lock()
        self.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(target[0])))
        have = evolve.columns(self.conn, target, generated=True)
        if not have:
            first = history.creation_columns(info, self._columns_then(source_table))
            self.conn.execute(sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({}))").format(
                ident,
                sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c.name), merge.column_type(c)) for c in first),
                sql.SQL(", ").join(map(sql.Identifier, info.primary_key))))
            have = {c.name: "" for c in first}
        for c in info.columns:
            if c.name not in have:
                self.conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                    ident, sql.Identifier(c.name), merge.column_type(c)))
        for g in info.generated:  # computed by the mirror as the source computes them (values.md)
            if g.name not in have:
                evolve.add_generated(self.conn, target, g.name, g.type_sql, g.expression)
        mirror = history.mirror_info(info, evolve.columns(self.conn, target))
        self._pending[key] = (columns, mirror)
        return target, mirror

    def _columns_then(self, table: str) -> list[dict[str, object]] | None:
        """A mirror table created behind a schema change takes the columns the log says it had (history.py)."""
        state = self.context.state
        return None if state is None else history.columns_before_next_change(state, self.context.schema, table,
                                                                               self._position)

    def _follow(self, source_table: str, target: tuple[str, str], info: TableInfo, seq: int) -> TableInfo:
        """Apply the `schema` message at ``seq`` to the mirror table; returns its new description."""
        assert self.conn is not None
        row = self.conn.execute("SELECT msg->'record' FROM _cdc_stage WHERE seq = %s", (seq,)).fetchone()
        self._ddl_lock()
        evolve.apply(self.conn, target, source_table, row[0] if row else {}, info.primary_key)
        mirror = history.mirror_info(info, evolve.columns(self.conn, target))
        key = ".".join(target)
        self._pending[key] = (self._pending.get(key, self._shapes.get(key, ((), mirror)))[0], mirror)
        return mirror

    def _mirror(self, n: int, shapes: list[typed.Columns]) -> None:
        assert self.conn is not None
        conn = self.conn
        tables = [f"{r[0]}.{r[1]}" for r in conn.execute(
            "SELECT DISTINCT msg->'metadata'->>'table_schema', msg->'metadata'->>'table_name' FROM _cdc_stage"
        ).fetchall()]
        if shapes:
            tables = list(dict.fromkeys([*tables, *typed.tables(conn)]))
        for table in tables:
            schema, _, name = table.partition(".")
            kinds = dict(conn.execute(
                "SELECT seq, msg->>'action' FROM _cdc_stage WHERE msg->>'action' IN ('truncate', 'schema') "
                "AND msg->'metadata'->>'table_schema' = %s AND msg->'metadata'->>'table_name' = %s ORDER BY seq",
                (schema, name)).fetchall())
            if "schema" in kinds.values() and not shapes and evolve.nothing_to_alter(conn, self._target(table), table):
                continue  # schema changes alone, and no mirror table yet: the first row creates it as the source is
            target, info = self._sync_table(table)
            start = 0
            for cut in [*kinds, n]:
                if not shapes:
                    merge.mirror_segment(conn, target, info, schema, name, start, cut)
                for lo, hi, shape in typed.runs(conn, schema, name, start, cut) if shapes else []:
                    if shape == typed.JSON_RUN:
                        merge.mirror_segment(conn, target, info, schema, name, lo, hi + 1)
                    else:
                        typed.apply_run(conn, target, info, schema, name, shapes[shape], shape, lo, hi, self._plain)
                if kinds.get(cut) == "truncate":
                    conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(*target)))
                elif kinds.get(cut) == "schema":
                    info = self._follow(table, target, info, cut)
                start = cut + 1
