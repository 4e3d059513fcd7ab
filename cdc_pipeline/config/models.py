"""The pipeline config model: source, state, spark, drain, delivery, backfill, tables, sinks."""

from contextvars import ContextVar
from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticKnownError

from cdc_pipeline.config.api_sources import ApiSourceConfig, check_api_sources
from cdc_pipeline.config.base import (
    DSN_MESSAGE,
    SLOT_RE,
    Dsn,
    StrictModel,
    dsn_parses,
    identifier,
    string_map,
)
from cdc_pipeline.config.errors import ConfigError, Loc, fail
from cdc_pipeline.config.sinks import SinkConfig
from cdc_pipeline.config.tables import TableConfig
from cdc_pipeline.core.run_ports import run_ports_problem

_DEPRECATED = "Deprecated: accepted and validated, has no effect (loading warns)."


class SourceConfig(StrictModel):
    dsn: Dsn = Field(min_length=1, description="The source database (libpq URL or key=value DSN); use `${VAR}` "
                     "for the password.")
    slot: str = Field(default="cdc_pipeline", description="Logical replication slot (pgoutput) that `setup` "
                      "creates and the drain reads.")
    publication: str = Field(default="cdc_pipeline", description="Publication of the configured tables, "
                             "created and extended by `setup`.")
    failover: bool = Field(default=False, description="Make the slot a failover slot (PostgreSQL 17+): `setup` "
                           "creates it so (or alters it), a standby with `sync_replication_slots = on` keeps a copy, "
                           "and after a promotion the drain goes on from that copy. `check` verifies the primary's "
                           "`synchronized_standby_slots` and the slot's flag, and says what to set on the standby.")
    primary_dsn: Dsn | None = Field(default=None, min_length=1, description="With `dsn` naming a standby "
                                    "(PostgreSQL 16+, decoding on the standby): its primary, for what only a "
                                    "primary can do: `setup` of the publication and schema-change capture, the "
                                    "drain's heartbeats and probes, the backfills' watermarks. The slot lives on "
                                    "the standby, and backfills read there once it has replayed each page's low "
                                    "watermark. Also the default state database. Unset: `dsn` is the primary.")

    @field_validator("slot")
    @classmethod
    def _check_slot(cls, value: str) -> str:
        if not SLOT_RE.match(value):
            raise ValueError(
                "must be 1-63 lower-case letters, digits or underscores "
                f"(PostgreSQL replication slot name rule) (got {value!r})"
            )
        return value

    @field_validator("publication")
    @classmethod
    def _check_publication(cls, value: str) -> str:
        return identifier(value)


class StateConfig(StrictModel):
    dsn: Dsn | None = Field(default=None, min_length=1, description="The state database (change log, offsets, "
                            "parked messages, backfills); default: the source database (`source.primary_dsn` when set: a standby is "
                            "read-only).")
    # `schema` would shadow BaseModel.schema(), hence the alias.
    schema_name: str = Field(default="cdc_pipeline", alias="schema", description="Schema of the state tables.")
    retention_hours: float | None = Field(default=None, gt=0, description="Delete log rows older than this that "
                                          "nothing still needs (every sink passed them, none parked, no backfill "
                                          "page needs them); default: keep everything.")
    max_backlog_hours: float | None = Field(default=None, gt=0, description="A sink whose oldest undelivered "
                                            "change is older than this: a row stream is re-synced by a backfill, "
                                            "a change stream is stopped; default: no limit.")

    @field_validator("schema_name")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        return identifier(value)


class SparkConfig(StrictModel):
    master: str = Field(default="local[*]", min_length=1, description="Spark master URL of the delivery "
                        "runs' SparkSession.")
    conf: dict[str, str] = Field(default_factory=dict, description="Spark settings (`spark.*` keys); applied at "
                                 "run time, never stored in Dagster's snapshots.")

    @field_validator("conf", mode="before")
    @classmethod
    def _coerce_conf(cls, value: Any) -> Any:
        return string_map(value)


class DrainConfig(StrictModel):
    tick_seconds: float = Field(default=20, gt=0, description=_DEPRECATED)  # loading.DEPRECATED_KEYS
    heartbeat_seconds: float = Field(default=5, gt=0, description="Emit a heartbeat message this often, so an "
                                     "idle database's slot advances.")
    batch_rows: int = Field(default=20000, gt=0, description="Write the drain's buffer to the log at this many "
                            "rows (or `batch_bytes`, whichever first).")
    batch_ms: int = Field(default=200, gt=0, description="Commit to the log at least this often while changes "
                          "keep coming (a quiet stream is committed at once; a busy one after six times the last "
                          "commit's duration, at least 15 ms, when that is sooner).")
    idle_seconds: float = Field(default=2, gt=0, description=_DEPRECATED)  # loading.DEPRECATED_KEYS
    run_minutes: float = Field(default=30, gt=0, description="Dagster: one `cdc_drain` run streams this long, "
                               "then the drain sensor starts the next one.")
    max_lag_seconds: float = Field(default=60, gt=0, description="Dagster: the `slot_lag_below_max` check fails "
                                   "when the slot is further behind than this.")
    report_seconds: float = Field(default=60, gt=0, description="Dagster: the drain run records a "
                                  "materialization of `cdc/change_log` at most this often, and only when the log "
                                  "moved (the live figures are in `status` and the metrics).")
    batch_bytes: int = Field(default=64 * 1024 * 1024, gt=0, description="Write the drain's buffer to the log "
                             "at this many bytes (or `batch_rows`, whichever first).")
    status_interval_seconds: float = Field(default=10, gt=0, description="Report the flushed position at least "
                                           "this often (as `pg_recvlogical --status-interval`), more often when "
                                           "the server's `wal_sender_timeout` needs it.")
    retry_initial_ms: int = Field(default=500, gt=0, description="First delay before reconnecting after a lost "
                                  "or refused connection (capped exponential backoff with jitter).")
    retry_max_ms: int = Field(default=30000, gt=0, description="Cap of the reconnect delay; at least "
                              "`retry_initial_ms`.")
    on_gap: Literal["stop", "backfill"] = Field(default="stop", description="When the state database is behind "
                                                "the slot (restored from an older backup): `stop` names the tables "
                                                "and LSN range and exits 1; `backfill` records and runs full "
                                                "backfills of them.")

    @model_validator(mode="after")
    def _check_retry(self) -> "DrainConfig":
        if self.retry_max_ms < self.retry_initial_ms:
            fail((("retry_max_ms",), f"must be at least retry_initial_ms ({self.retry_initial_ms}) "
                                     f"(got {self.retry_max_ms})"))
        return self


class DeliveryConfig(StrictModel):
    batch_size: int = Field(default=20000, gt=0, description="Messages per call to a sink whose type declares no "
                            "`batch_size` of its own (the sink's `batch_size` overrides it): log rows per call, each "
                            "settled on its own; for a sink whose calls are requests, the most log rows settled together. "
                            "The log is read and staged in blocks of at least 1,000 rows whatever the size.")
    batch_bytes: int = Field(default=64 * 1024 * 1024, gt=0, description="A batch also ends once its messages "
                             "hold this many bytes of record and changes JSON (at least one message per batch).")
    idle_seconds: float = Field(default=0.25, gt=0, description="How often a long-running delivery looks at "
                                "an idle log without being told (the drain's notification wakes it at once).")
    lag_trigger_messages: int = Field(default=1, ge=1, description=_DEPRECATED)  # loading.DEPRECATED_KEYS
    max_parked_age_seconds: float = Field(default=3600, gt=0, description="Dagster: `no_stale_parked_messages` "
                                          "warns when a message has been parked longer than this.")
    run_minutes: float = Field(default=30, gt=0, description="Dagster: one delivery run per sink streams this "
                               "long (Spark stays warm), then the delivery sensor starts the next one.")
    max_lag_seconds: float = Field(default=60, gt=0, description="Dagster: `lag_below_max` fails when a sink's "
                                   "oldest undelivered change is older than this.")
    report_seconds: float = Field(default=60, gt=0, description="Dagster: a delivery run records a "
                                  "materialization of `sink/<name>` at most this often, and only when its offset "
                                  "moved (the live figures are in `status` and the metrics).")
    retry_initial_ms: int = Field(default=500, gt=0, description="First delay while waiting for a destination "
                                  "(or state database) that is down; never counted against `max_retries`.")
    retry_max_ms: int = Field(default=30000, gt=0, description="Cap of that delay; at least `retry_initial_ms`.")

    @model_validator(mode="after")
    def _check_retry(self) -> "DeliveryConfig":
        if self.retry_max_ms < self.retry_initial_ms:
            fail((("retry_max_ms",), f"must be at least retry_initial_ms ({self.retry_initial_ms}) "
                                     f"(got {self.retry_max_ms})"))
        return self


class BackfillConfig(StrictModel):
    max_query_ms: int = Field(default=5000, gt=0, description="Each page's select and staging stays under this: "
                              "the page size adapts.")
    max_page_size: int = Field(default=50000, gt=0, description="Largest page (rows).")
    initial_page_size: int = Field(default=1000, gt=0, description="First page size (rows); at most "
                                   "`max_page_size`.")
    max_staged_pages: int = Field(default=4, gt=0, description="Reading pauses while more pages than this wait "
                                  "for the drain to reconcile them.")
    max_sink_backlog: int = Field(default=500000, gt=0, description="Reading pauses while a target sink has more "
                                  "undelivered messages than this.")
    max_parallel: int = Field(default=2, gt=0, description="Non-overlapping windows (partitions) of one table "
                              "and sink backfilled side by side.")

    @model_validator(mode="after")
    def _check_pages(self) -> "BackfillConfig":
        if self.initial_page_size > self.max_page_size:
            fail(
                (
                    ("initial_page_size",),
                    f"must not exceed max_page_size ({self.max_page_size}) (got {self.initial_page_size})",
                )
            )
        return self



_API_ONLY: ContextVar[bool] = ContextVar("cdc_pipeline_api_only", default=False)


class MetricsConfig(StrictModel):
    """Prometheus /metrics, /healthz and /readyz of drain, deliver, serve and api-sync (off without a port) and
    of the long-lived Dagster runs (off without `run_ports_from`)."""

    port: int | None = Field(default=None, ge=0, le=65535, description="Port to serve on; none: off "
                             "(`--metrics-port` overrides it).")
    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    run_ports_from: int | None = Field(default=None, ge=1, le=65535, description="Dagster: the long-lived "
                                       "runs serve the same endpoints, the drain run on this port and each sink "
                                       "lane's delivery run on the next ones (sinks in config order, lanes 0 to "
                                       "N-1); none: off. The map: docs/explanation/operations.md.")


class PipelineConfig(StrictModel):
    source: SourceConfig = Field(description="The database captured.")
    state: StateConfig = Field(default_factory=StateConfig, description="Where the change log and the "
                               "pipeline's state live.")
    spark: SparkConfig = Field(default_factory=SparkConfig, description="The SparkSession of delivery.")
    drain: DrainConfig = Field(default_factory=DrainConfig, description="Capture: slot -> change log.")
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig, description="Change log -> sinks.")
    backfill: BackfillConfig = Field(default_factory=BackfillConfig, description="Backfill pacing.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Prometheus `/metrics`, "
                                   "`/healthz` and `/readyz` of long-running commands (off by default).")
    tables: list[TableConfig] = Field(description="The captured tables; may be empty or absent only when "
                                      "`api_sources` is set.")
    sinks: list[SinkConfig] = Field(default_factory=list, description="Where the changes go.")
    api_sources: list[ApiSourceConfig] = Field(default_factory=list, description="SaaS APIs kept in step with "
                                               "Postgres tables.")

    # Private, so a `path:` key in the YAML is an unknown-key error rather than an override.
    _path: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _api_only(cls, data: Any) -> Any:
        # Field validators see only the fields before them, so whether `tables` may be empty is noted
        # here, from the raw input; this keeps its error in place among the others.
        api_only = isinstance(data, dict) and bool(data.get("api_sources"))
        _API_ONLY.set(api_only)
        if api_only and "tables" not in data:
            return {**data, "tables": []}
        return data

    @field_validator("tables")
    @classmethod
    def _check_tables(cls, value: list[TableConfig]) -> list[TableConfig]:
        if not value and not _API_ONLY.get():
            raise PydanticKnownError("too_short", {"field_type": "List", "min_length": 1, "actual_length": 0})
        return value

    @model_validator(mode="after")
    def _check_references(self) -> "PipelineConfig":
        problems: list[tuple[Loc, str]] = check_api_sources(self.api_sources)
        first_table: dict[str, int] = {}
        for i, table in enumerate(self.tables):
            if table.qualified in first_table:
                problems.append(
                    (
                        ("tables", i, "name"),
                        f"duplicate table '{table.qualified}' (also tables[{first_table[table.qualified]}])",
                    )
                )
            else:
                first_table[table.qualified] = i
        first_sink: dict[str, int] = {}
        for i, sink in enumerate(self.sinks):
            if sink.name in first_sink:
                problems.append(
                    (
                        ("sinks", i, "name"),
                        f"duplicate sink '{sink.name}' (also sinks[{first_sink[sink.name]}])",
                    )
                )
            else:
                first_sink[sink.name] = i
            if sink.lanes > 1 and self.state.max_backlog_hours is not None:
                # A resync moves one offset past the backlog; lanes have several (core/lanes.py).
                problems.append((("sinks", i, "lanes"), "lanes above 1 cannot be combined with "
                                 "state.max_backlog_hours"))
            for j, name in enumerate(sink.tables):
                if name not in first_table:
                    problems.append(
                        (
                            ("sinks", i, "tables", j),
                            f"unknown table '{name}' (configured tables: {', '.join(first_table)})",
                        )
                    )
        if self.metrics.run_ports_from is not None:
            why = run_ports_problem(self.metrics.run_ports_from, [(s.name, s.lanes) for s in self.sinks],
                                    self.metrics.port)
            if why:
                problems.append((("metrics", "run_ports_from"), why))
        if problems:
            fail(*problems)
        return self

    @property
    def path(self) -> str | None:
        """The file this config was loaded from (None when parsed from a string)."""
        return self._path

    @property
    def state_dsn(self) -> str:
        """The state database: ``state.dsn``, defaulting to the source database (its primary, when the source
        is a standby: a standby is read-only)."""
        return self.state.dsn or self.source.primary_dsn or self.source.dsn

    @property
    def primary_dsn(self) -> str:
        """Where the source's writes go (heartbeats, watermarks, the publication): ``source.primary_dsn`` when
        the source is a standby, else the source itself."""
        return self.source.primary_dsn or self.source.dsn

    def check_dsns(self) -> None:
        """Raise ConfigError (a fixed message, never the value) for a DSN libpq cannot parse. Load lets a bare
        word through (a placeholder); commands that connect call this first, so a variable holding only a
        password is reported as a bad DSN, not echoed back by libpq's own parse error."""
        where: list[tuple[str, str | None]] = [("source.dsn", self.source.dsn), ("state.dsn", self.state.dsn),
                                               ("source.primary_dsn", self.source.primary_dsn)]
        where += [(f"sinks[{i}].destination.dsn", getattr(s.destination, "dsn", None)) for i, s in enumerate(self.sinks)]
        where += [(f"api_sources[{i}].dsn", a.dsn) for i, a in enumerate(self.api_sources)]
        bad = [f"{self._label()}: {key}: {DSN_MESSAGE}" for key, value in where if value and not dsn_parses(value)]
        if bad:
            raise ConfigError("\n".join(bad), bad)

    def table(self, name: str) -> TableConfig:
        """The table named 'schema.table' or bare 'table' (meaning public.table)."""
        qualified = name if "." in name else f"public.{name}"
        for table in self.tables:
            if table.qualified == qualified:
                return table
        known = ", ".join(t.qualified for t in self.tables)
        raise ConfigError(f"{self._label()}: unknown table {name!r} (configured tables: {known})")

    def sink(self, name: str) -> SinkConfig:
        for sink in self.sinks:
            if sink.name == name:
                return sink
        known = ", ".join(s.name for s in self.sinks) or "none"
        raise ConfigError(f"{self._label()}: unknown sink {name!r} (configured sinks: {known})")

    def api_source(self, name: str) -> ApiSourceConfig:
        for source in self.api_sources:
            if source.name == name:
                return source
        known = ", ".join(s.name for s in self.api_sources) or "none"
        raise ConfigError(f"{self._label()}: unknown api source {name!r} (configured api sources: {known})")

    def _label(self) -> str:
        return self._path or "config"

