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


class SourceConfig(StrictModel):
    dsn: Dsn = Field(min_length=1)
    slot: str = "cdc_pipeline"
    publication: str = "cdc_pipeline"

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
    dsn: Dsn | None = Field(default=None, min_length=1)
    # `schema` would shadow BaseModel.schema(), hence the alias.
    schema_name: str = Field(default="cdc_pipeline", alias="schema")
    retention_hours: float | None = Field(default=None, gt=0)
    # A sink further behind than this: a row stream is re-synced by a backfill, a change stream stops
    # loudly (delivery/backlog.py). None: the log keeps everything until every sink has passed it.
    max_backlog_hours: float | None = Field(default=None, gt=0)

    @field_validator("schema_name")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        return identifier(value)


class SparkConfig(StrictModel):
    master: str = Field(default="local[*]", min_length=1)
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("conf", mode="before")
    @classmethod
    def _coerce_conf(cls, value: Any) -> Any:
        return string_map(value)


class DrainConfig(StrictModel):
    tick_seconds: float = Field(default=20, gt=0)  # deprecated: accepted, has no effect (loading.DEPRECATED_KEYS)
    heartbeat_seconds: float = Field(default=5, gt=0)
    batch_rows: int = Field(default=20000, gt=0)
    # Commit to the log at least this often: bounds the capture part of commit-to-sink latency.
    batch_ms: int = Field(default=200, gt=0)
    idle_seconds: float = Field(default=2, gt=0)  # deprecated: accepted, has no effect (loading.DEPRECATED_KEYS)
    # Dagster: one drain run streams this long, then the drain sensor starts the next one.
    run_minutes: float = Field(default=30, gt=0)
    # Dagster: the change log's slot_lag check fails when the slot is further behind than this.
    max_lag_seconds: float = Field(default=60, gt=0)
    # The drain's buffer is written to the log at batch_rows rows or this many bytes, whichever first.
    batch_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # Standby status updates at least this often (as pg_recvlogical --status-interval), and more often
    # when the server's wal_sender_timeout needs it.
    status_interval_seconds: float = Field(default=10, gt=0)
    # A lost connection is retried with capped exponential backoff and jitter.
    retry_initial_ms: int = Field(default=500, gt=0)
    retry_max_ms: int = Field(default=30000, gt=0)
    # The state database's progress is behind the slot (restored from an older backup): stop, or
    # accept the slot's position and backfill the published tables.
    on_gap: Literal["stop", "backfill"] = "stop"

    @model_validator(mode="after")
    def _check_retry(self) -> "DrainConfig":
        if self.retry_max_ms < self.retry_initial_ms:
            fail((("retry_max_ms",), f"must be at least retry_initial_ms ({self.retry_initial_ms}) "
                                     f"(got {self.retry_max_ms})"))
        return self


class DeliveryConfig(StrictModel):
    batch_size: int = Field(default=20000, gt=0)
    # A batch also ends once its messages hold this many bytes of JSON (very large rows).
    batch_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # How often a long-running delivery polls an idle log: bounds the delivery part of the latency.
    idle_seconds: float = Field(default=0.25, gt=0)
    lag_trigger_messages: int = Field(default=1, ge=1)  # deprecated: accepted, has no effect (loading.DEPRECATED_KEYS)
    # The Dagster asset check fails when a message has been parked longer than this.
    max_parked_age_seconds: float = Field(default=3600, gt=0)
    # Dagster: one long-lived delivery run per sink streams this long (Spark stays warm meanwhile).
    run_minutes: float = Field(default=30, gt=0)
    # Dagster: a sink's lag check fails when its oldest undelivered change is older than this.
    max_lag_seconds: float = Field(default=60, gt=0)
    # A destination (or the state database) that is down is waited for with capped exponential
    # backoff and jitter: never counted against a message's max_retries.
    retry_initial_ms: int = Field(default=500, gt=0)
    retry_max_ms: int = Field(default=30000, gt=0)

    @model_validator(mode="after")
    def _check_retry(self) -> "DeliveryConfig":
        if self.retry_max_ms < self.retry_initial_ms:
            fail((("retry_max_ms",), f"must be at least retry_initial_ms ({self.retry_initial_ms}) "
                                     f"(got {self.retry_max_ms})"))
        return self


class BackfillConfig(StrictModel):
    max_query_ms: int = Field(default=5000, gt=0)
    max_page_size: int = Field(default=50000, gt=0)
    initial_page_size: int = Field(default=1000, gt=0)
    max_staged_pages: int = Field(default=4, gt=0)
    max_sink_backlog: int = Field(default=500000, gt=0)
    # Windows of one table (partitions) that do not overlap may be backfilled side by side, this many.
    max_parallel: int = Field(default=2, gt=0)

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
    """Prometheus /metrics, /healthz and /readyz of drain, deliver, serve and api-sync (off without a port)."""

    port: int | None = Field(default=None, ge=0, le=65535)
    host: str = "127.0.0.1"


class PipelineConfig(StrictModel):
    source: SourceConfig
    state: StateConfig = Field(default_factory=StateConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    drain: DrainConfig = Field(default_factory=DrainConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    backfill: BackfillConfig = Field(default_factory=BackfillConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    # May be empty (or absent) only when api_sources is set: an API-sync-only pipeline captures nothing.
    tables: list[TableConfig]
    sinks: list[SinkConfig] = Field(default_factory=list)
    api_sources: list[ApiSourceConfig] = Field(default_factory=list)

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
            for j, name in enumerate(sink.tables):
                if name not in first_table:
                    problems.append(
                        (
                            ("sinks", i, "tables", j),
                            f"unknown table '{name}' (configured tables: {', '.join(first_table)})",
                        )
                    )
        if problems:
            fail(*problems)
        return self

    @property
    def path(self) -> str | None:
        """The file this config was loaded from (None when parsed from a string)."""
        return self._path

    @property
    def state_dsn(self) -> str:
        """The state database: ``state.dsn``, defaulting to the source database."""
        return self.state.dsn or self.source.dsn

    def check_dsns(self) -> None:
        """Raise ConfigError (a fixed message, never the value) for a DSN libpq cannot parse. Load lets a bare
        word through (a placeholder); commands that connect call this first, so a variable holding only a
        password is reported as a bad DSN, not echoed back by libpq's own parse error."""
        where: list[tuple[str, str | None]] = [("source.dsn", self.source.dsn), ("state.dsn", self.state.dsn)]
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

