"""Load, interpolate and validate the pipeline's YAML configuration (``cdc.yaml``).

Contract (DESIGN.md, "Config"): the path comes from ``--config`` or ``CDC_CONFIG``; ``${VAR}`` and
``${VAR:-default}`` are interpolated from the environment; every problem is reported as one line naming
the file, the key path and what is wrong, and secrets never appear in those lines.
"""

import difflib
import os
import re
import types
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "BackfillConfig",
    "BackoffConfig",
    "ConfigError",
    "DeliveryConfig",
    "Destination",
    "DrainConfig",
    "NatsDestination",
    "ParquetDestination",
    "PartitionsConfig",
    "PipelineConfig",
    "PostgresDestination",
    "RabbitMQDestination",
    "RedisStreamDestination",
    "SinkConfig",
    "SourceConfig",
    "SparkConfig",
    "StateConfig",
    "TableConfig",
    "WebhookDestination",
    "load_config",
    "parse_config",
    "redact",
]

CONFIG_ENV_VAR = "CDC_CONFIG"

Loc = tuple[str | int, ...]


# --------------------------------------------------------------------------------------------------
# Errors and redaction
# --------------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """A configuration problem; ``str(e)`` is the full user-facing message (one line per problem)."""

    def __init__(self, message: str, problems: Sequence[str] | None = None) -> None:
        # Redact here too, so a message built anywhere can never leak a password into logs or the UI.
        message = redact(message)
        super().__init__(message)
        self.problems: list[str] = (
            [redact(p) for p in problems] if problems is not None else message.splitlines()
        )


_URL_PASSWORD_RE = re.compile(
    # scheme://user:PASSWORD@host. The password runs to the last '@' before the first '/', as libpq
    # parses it (so a raw '#' or '?' in a password is still masked).
    r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*:)(?P<secret>[^\s/]*)(?=@)"
)
_SECRET_WORD = r"[\w-]*(?:password|passwd|pwd|secret|token|api[_-]?key)"
_SECRET_VALUE = r"(?P<secret>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&,;'\"]+)"
_KEY_VALUE_SECRET_RES = (
    # libpq key/value DSNs and query strings: password=..., sslpassword='...', ?token=...&
    re.compile(rf"(?i)(?P<pre>(?<![\w-]){_SECRET_WORD}\s*=\s*){_SECRET_VALUE}"),
    # JSON/dict-ish text: "password": "...". Unquoted `key: value` is left alone, because error
    # lines themselves have the form `path.to.key: message`.
    re.compile(rf"(?i)(?P<pre>[\"'](?:{_SECRET_WORD}|authorization)[\"']\s*:\s*){_SECRET_VALUE}"),
    # HTTP credentials: Authorization: Bearer ...
    re.compile(r"(?i)(?P<pre>\b(?:bearer|basic)\s+)(?P<secret>[A-Za-z0-9._~+/=\-]{8,})"),
)


def redact(text: str) -> str:
    """Mask anything that looks like a password in ``text`` (DSN/URL userinfo, ``password=...``).

    ``postgresql://u:pw@h/db`` becomes ``postgresql://u:***@h/db``; ``password=pw`` becomes
    ``password=***``. Used for error messages and logs.
    """
    text = _URL_PASSWORD_RE.sub(r"\g<pre>***", text)
    for pattern in _KEY_VALUE_SECRET_RES:
        text = pattern.sub(r"\g<pre>***", text)
    return text


_PROBLEMS = "cdc_config_problems"
_PLAIN_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def _format_loc(loc: Sequence[Any]) -> str:
    out = ""
    for el in loc:
        if isinstance(el, int):
            out += f"[{el}]"
        elif isinstance(el, str) and _PLAIN_KEY_RE.match(el):
            out += f".{el}" if out else el
        else:
            # Keys like "spark.sql.shuffle.partitions" would be ambiguous with dots.
            out += f"[{str(el)!r}]"
    return out


def _fail(*problems: tuple[Loc, str]) -> NoReturn:
    """Raise several problems at once from a validator, each with a path relative to the validator.

    Pydantic gives one error per validator, at the validator's location; the converter in
    ``_validation_lines`` expands these back into separate lines at their precise paths.
    """
    summary = "; ".join(f"{_format_loc(loc) or '.'}: {msg}" for loc, msg in problems)
    raise PydanticCustomError(_PROBLEMS, "{summary}", {"summary": summary, "problems": list(problems)})


# --------------------------------------------------------------------------------------------------
# Shared validators
# --------------------------------------------------------------------------------------------------

_IDENT = r"[A-Za-z_][A-Za-z0-9_$]{0,62}"
_IDENT_RE = re.compile(rf"^{_IDENT}$")
_QUALIFIED_RE = re.compile(rf"^(?:(?P<schema>{_IDENT})\.)?(?P<table>{_IDENT})$")
_SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")
_SINK_NAME_RE = re.compile(r"^[A-Za-z0-9_\-]{1,63}$")
_CALLABLE_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def _qualify(name: str) -> str:
    """'schema.table' stays, bare 'table' means 'public.table' (PostgreSQL's default schema)."""
    m = _QUALIFIED_RE.match(name)
    if m is None:
        raise ValueError(f"must be 'schema.table' or 'table' (got {name!r})")
    return f"{m['schema'] or 'public'}.{m['table']}"


def _identifier(value: str) -> str:
    if not _IDENT_RE.match(value):
        raise ValueError(
            f"must be an identifier of 1-63 letters, digits, '_' or '$', not starting with a digit (got {value!r})"
        )
    return value


def _url_with_scheme(value: str, schemes: tuple[str, ...]) -> str:
    parts = urlsplit(value)
    if parts.scheme.lower() not in schemes or not (parts.netloc or parts.path):
        # Never echo the URL: it may carry credentials.
        raise ValueError("must be a URL starting with " + " or ".join(f"{s}://" for s in schemes))
    return value


def _string_map(value: Any) -> Any:
    """Coerce scalar mapping values to strings (YAML reads `4` as int and `true` as bool)."""
    if not isinstance(value, Mapping):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            item = "true" if item else "false"  # Spark and HTTP want lower-case booleans, not "True"
        elif isinstance(item, int | float):
            item = str(item)
        out[key] = item
    return out


class _Model(BaseModel):
    # hide_input_in_errors: a ValidationError printed by code that builds models directly must not
    # leak DSNs either.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True)


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------


class SourceConfig(_Model):
    dsn: str = Field(min_length=1)
    slot: str = "cdc_pipeline"
    publication: str = "cdc_pipeline"

    @field_validator("slot")
    @classmethod
    def _check_slot(cls, value: str) -> str:
        if not _SLOT_RE.match(value):
            raise ValueError(
                "must be 1-63 lower-case letters, digits or underscores "
                f"(PostgreSQL replication slot name rule) (got {value!r})"
            )
        return value

    @field_validator("publication")
    @classmethod
    def _check_publication(cls, value: str) -> str:
        return _identifier(value)


class StateConfig(_Model):
    dsn: str | None = Field(default=None, min_length=1)
    # `schema` would shadow BaseModel.schema(), hence the alias.
    schema_name: str = Field(default="cdc_pipeline", alias="schema")
    retention_hours: float | None = Field(default=None, gt=0)

    @field_validator("schema_name")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        return _identifier(value)


class SparkConfig(_Model):
    master: str = Field(default="local[*]", min_length=1)
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("conf", mode="before")
    @classmethod
    def _coerce_conf(cls, value: Any) -> Any:
        return _string_map(value)


class DrainConfig(_Model):
    tick_seconds: float = Field(default=20, gt=0)
    heartbeat_seconds: float = Field(default=5, gt=0)
    batch_rows: int = Field(default=20000, gt=0)
    # Commit to the log at least this often: bounds the capture part of commit-to-sink latency.
    batch_ms: int = Field(default=200, gt=0)
    idle_seconds: float = Field(default=2, gt=0)


class DeliveryConfig(_Model):
    batch_size: int = Field(default=20000, gt=0)
    # How often a long-running delivery polls an idle log: bounds the delivery part of the latency.
    idle_seconds: float = Field(default=0.25, gt=0)
    lag_trigger_messages: int = Field(default=1, ge=1)
    # The Dagster asset check fails when a message has been parked longer than this.
    max_parked_age_seconds: float = Field(default=3600, gt=0)


class BackfillConfig(_Model):
    max_query_ms: int = Field(default=5000, gt=0)
    max_page_size: int = Field(default=50000, gt=0)
    initial_page_size: int = Field(default=1000, gt=0)
    max_staged_pages: int = Field(default=4, gt=0)
    max_sink_backlog: int = Field(default=500000, gt=0)

    @model_validator(mode="after")
    def _check_pages(self) -> "BackfillConfig":
        if self.initial_page_size > self.max_page_size:
            _fail(
                (
                    ("initial_page_size",),
                    f"must not exceed max_page_size ({self.max_page_size}) (got {self.initial_page_size})",
                )
            )
        return self


PartitionKind = Literal["daily", "hourly", "weekly", "monthly", "integer"]


class PartitionsConfig(_Model):
    kind: PartitionKind = "daily"
    start: str
    end: str | None = None
    step: int | None = Field(default=None, gt=0)  # integer partitions only

    @field_validator("start", "end", mode="before")
    @classmethod
    def _scalar_to_text(cls, value: Any) -> Any:
        # YAML turns `2024-01-01` into a date and `0` into an int; keep one canonical text form.
        if isinstance(value, datetime | date):
            return value.isoformat()
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @model_validator(mode="after")
    def _check_bounds(self) -> "PartitionsConfig":
        problems: list[tuple[Loc, str]] = []
        bounds: dict[str, Any] = {}
        for key in ("start", "end"):
            text = getattr(self, key)
            if text is None:
                continue
            try:
                bounds[key] = int(text) if self.kind == "integer" else datetime.fromisoformat(text)
            except ValueError:
                expected = "an integer" if self.kind == "integer" else "a date or datetime (ISO 8601)"
                problems.append(((key,), f"must be {expected} for kind '{self.kind}' (got {text!r})"))
        if self.step is not None and self.kind != "integer":
            problems.append((("step",), f"only applies to kind 'integer' (kind is '{self.kind}')"))
        if "start" in bounds and "end" in bounds:
            try:
                if bounds["end"] <= bounds["start"]:
                    problems.append((("end",), f"must be after start ({self.start}) (got {self.end!r})"))
            except TypeError:  # naive vs aware datetimes
                problems.append((("end",), "start and end must both have a time zone or both lack one"))
        if problems:
            _fail(*problems)
        return self


class TableConfig(_Model):
    name: str
    sort_column: str | None = None
    group_columns: list[str] | None = Field(default=None, min_length=1)
    partitions: PartitionsConfig | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        # Normalized to 'schema.table' so names compare equal however they were written.
        return _qualify(value)

    @field_validator("sort_column")
    @classmethod
    def _check_sort_column(cls, value: str | None) -> str | None:
        return None if value is None else _identifier(value)

    @field_validator("group_columns")
    @classmethod
    def _check_group_columns(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        problems: list[tuple[Loc, str]] = []
        seen: set[str] = set()
        for i, column in enumerate(value):
            try:
                _identifier(column)
            except ValueError as e:
                problems.append(((i,), str(e)))
            if column in seen:
                problems.append(((i,), f"column {column!r} is listed twice"))
            seen.add(column)
        if problems:
            _fail(*problems)
        return value

    @model_validator(mode="after")
    def _partitions_need_sort_column(self) -> "TableConfig":
        if self.partitions is not None and self.sort_column is None:
            _fail((("partitions",), "requires sort_column (partitions are windows of the sort column)"))
        return self

    @property
    def schema_name(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def qualified(self) -> str:
        return f"{self.schema_name}.{self.table_name}"


class BackoffConfig(_Model):
    initial_ms: int = Field(default=1000, gt=0)
    max_ms: int = Field(default=300000, gt=0)
    multiplier: float = Field(default=2.0, ge=1)
    jitter: float = Field(default=0.2, ge=0, le=1)

    @model_validator(mode="after")
    def _check_range(self) -> "BackoffConfig":
        if self.max_ms < self.initial_ms:
            _fail((("max_ms",), f"must be at least initial_ms ({self.initial_ms}) (got {self.max_ms})"))
        return self


class PostgresDestination(_Model):
    type: Literal["postgres"] = "postgres"
    dsn: str = Field(min_length=1)
    table: str
    mode: Literal["mirror", "append"] = "mirror"

    @field_validator("table")
    @classmethod
    def _check_table(cls, value: str) -> str:
        # '{schema}' and '{table}' stand for the source table's, so one mirror sink can serve many tables.
        probe = value.replace("{schema}", "s").replace("{table}", "t")
        _qualify(probe)
        return value if "." in value else f"public.{value}"


class WebhookDestination(_Model):
    type: Literal["webhook"] = "webhook"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_ms: int = Field(default=10000, gt=0)
    hmac_secret_env: str | None = None  # NAME of an environment variable holding the secret
    signature_header: str = "X-CDC-Signature"
    batch_size: int = Field(default=1000, gt=0)

    @field_validator("headers", mode="before")
    @classmethod
    def _coerce_headers(cls, value: Any) -> Any:
        return _string_map(value)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        problems: list[tuple[Loc, str]] = []
        for name, header in value.items():
            if not _HEADER_NAME_RE.match(name):
                problems.append(((name,), "is not a valid HTTP header name"))
            elif "\r" in header or "\n" in header:  # header injection
                problems.append(((name,), "must not contain line breaks"))
        if problems:
            _fail(*problems)
        return value

    @field_validator("hmac_secret_env")
    @classmethod
    def _check_secret_env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME_RE.match(value):
            # Deliberately does not echo the value: it is probably the secret itself.
            raise ValueError(
                "must be the NAME of an environment variable holding the secret "
                "(e.g. WEBHOOK_SECRET), never the secret itself"
            )
        return value

    @field_validator("signature_header")
    @classmethod
    def _check_signature_header(cls, value: str) -> str:
        if not _HEADER_NAME_RE.match(value):
            raise ValueError(f"is not a valid HTTP header name (got {value!r})")
        return value


class RedisStreamDestination(_Model):
    type: Literal["redis_stream"] = "redis_stream"
    url: str = "redis://127.0.0.1:6379/0"
    stream_key: str = Field(default="cdc", min_length=1)
    maxlen: int | None = Field(default=None, gt=0)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return _url_with_scheme(value, ("redis", "rediss", "unix"))


class NatsDestination(_Model):
    type: Literal["nats"] = "nats"
    url: str = "nats://127.0.0.1:4222"
    subject: str = Field(default="cdc", min_length=1)
    stream: str = Field(default="CDC", min_length=1)
    ack_timeout_ms: int = Field(default=5000, gt=0)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return _url_with_scheme(value, ("nats", "tls", "ws", "wss"))

    @field_validator("subject")
    @classmethod
    def _check_subject(cls, value: str) -> str:
        if any(c.isspace() for c in value) or "" in value.split("."):
            raise ValueError(f"must be dot-separated tokens without spaces (got {value!r})")
        return value

    @field_validator("stream")
    @classmethod
    def _check_stream(cls, value: str) -> str:
        if any(c.isspace() or c in ".*>/\\" for c in value):
            raise ValueError(f"must not contain spaces or any of . * > / \\ (got {value!r})")
        return value


class RabbitMQDestination(_Model):
    type: Literal["rabbitmq"] = "rabbitmq"
    url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    exchange: str = "cdc"
    exchange_type: Literal["topic", "direct", "fanout", "headers"] = "topic"
    routing_key: str = "cdc"

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return _url_with_scheme(value, ("amqp", "amqps"))


class ParquetDestination(_Model):
    type: Literal["parquet"] = "parquet"
    path: str = Field(min_length=1)


Destination = Annotated[
    PostgresDestination
    | WebhookDestination
    | RedisStreamDestination
    | NatsDestination
    | RabbitMQDestination
    | ParquetDestination,
    Field(discriminator="type"),
]
_DESTINATION_TYPES: tuple[str, ...] = tuple(
    get_args(model.model_fields["type"].annotation)[0] for model in get_args(get_args(Destination)[0])
)

Action = Literal["insert", "update", "delete"]


class SinkConfig(_Model):
    name: str
    tables: list[str] = Field(min_length=1)
    actions: list[Action] = Field(default_factory=lambda: ["insert", "update", "delete"], min_length=1)
    filter: str | None = Field(default=None, min_length=1)  # Spark SQL boolean expression
    # 'package.module:function' (DataFrame -> DataFrame), or output field -> Spark SQL expression.
    transform: str | dict[str, str] | None = None
    route: str | None = Field(default=None, min_length=1)
    message_grouping: bool = True
    max_retries: int | None = Field(default=None, ge=0)  # None = retry forever
    backoff: BackoffConfig = Field(default_factory=BackoffConfig)
    batch_size: int | None = Field(default=None, gt=0)
    destination: Destination

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _SINK_NAME_RE.match(value):
            raise ValueError(f"must be 1-63 letters, digits, '_' or '-' (got {value!r})")
        return value

    @field_validator("tables")
    @classmethod
    def _check_tables(cls, value: list[str]) -> list[str]:
        problems: list[tuple[Loc, str]] = []
        out: list[str] = []
        for i, name in enumerate(value):
            try:
                qualified = _qualify(name)
            except ValueError as e:
                problems.append(((i,), str(e)))
                continue
            if qualified in out:
                problems.append(((i,), f"table '{qualified}' is listed twice"))
            out.append(qualified)
        if problems:
            _fail(*problems)
        return out

    @field_validator("actions")
    @classmethod
    def _dedupe_actions(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @field_validator("transform", mode="before")
    @classmethod
    def _check_transform(cls, value: Any) -> Any:
        # Checked here rather than by the str|dict union so the user gets one clear message instead
        # of one per union member.
        if value is None:
            return None
        if isinstance(value, str):
            if not _CALLABLE_RE.match(value):
                raise ValueError(
                    "must look like 'package.module:function', or be a mapping of output field to "
                    f"Spark SQL expression (got {value!r})"
                )
            return value
        if isinstance(value, Mapping):
            if not value:
                raise ValueError("must not be an empty mapping")
            problems: list[tuple[Loc, str]] = []
            out: dict[str, str] = {}
            for field, expr in value.items():
                if not isinstance(field, str) or not field:
                    problems.append(((str(field),), "output field name must be a non-empty string"))
                elif isinstance(expr, bool) or not isinstance(expr, str | int | float):
                    problems.append(((field,), "must be a Spark SQL expression (a string)"))
                elif not str(expr).strip():
                    problems.append(((field,), "must not be empty"))
                else:
                    out[field] = str(expr)
            if problems:
                _fail(*problems)
            return out
        raise ValueError(
            "must be 'package.module:function' or a mapping of output field to Spark SQL expression "
            f"(got {_kind(value)})"
        )


class PipelineConfig(_Model):
    source: SourceConfig
    state: StateConfig = Field(default_factory=StateConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    drain: DrainConfig = Field(default_factory=DrainConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    backfill: BackfillConfig = Field(default_factory=BackfillConfig)
    tables: list[TableConfig] = Field(min_length=1)
    sinks: list[SinkConfig] = Field(default_factory=list)

    # Private, so a `path:` key in the YAML is an unknown-key error rather than an override.
    _path: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_references(self) -> "PipelineConfig":
        problems: list[tuple[Loc, str]] = []
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
            _fail(*problems)
        return self

    @property
    def path(self) -> str | None:
        """The file this config was loaded from (None when parsed from a string)."""
        return self._path

    @property
    def state_dsn(self) -> str:
        """The state database: ``state.dsn``, defaulting to the source database."""
        return self.state.dsn or self.source.dsn

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

    def _label(self) -> str:
        return self._path or "config"


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> PipelineConfig:
    """Load the config from ``path``, else from the file named by ``$CDC_CONFIG``.

    Raises ConfigError for any problem (missing file, YAML syntax, interpolation, validation).
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    if path is None:
        path = env.get(CONFIG_ENV_VAR) or None
        if path is None:
            raise ConfigError(f"no configuration file given: pass --config PATH or set {CONFIG_ENV_VAR}")
    name = os.fsdecode(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{name}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: not valid UTF-8 text (byte offset {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{name}: cannot read file ({e.strerror})") from None
    config = _parse(text, name, env)
    config._path = name
    return config


def parse_config(text: str, source_name: str, environ: Mapping[str, str] | None = None) -> PipelineConfig:
    """Parse YAML ``text``; ``source_name`` is the name used in error messages."""
    return _parse(text, source_name, os.environ if environ is None else environ)


def _parse(text: str, source: str, environ: Mapping[str, str]) -> PipelineConfig:
    data = _load_yaml(text, source)
    if data is None:
        raise ConfigError(f"{source}: file is empty (expected a mapping with source, tables, sinks, ...)")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: top level must be a mapping with source, tables, sinks, ... (got {_kind(data)})"
        )
    problems: list[tuple[Loc, str]] = []
    data = _interpolate_tree(data, (), environ, problems)
    if problems:
        _raise_lines(source, problems)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as e:
        _raise_lines(source, _validation_lines(e, data))


def _raise_lines(source: str, problems: Sequence[tuple[Loc, str]]) -> NoReturn:
    lines = []
    for loc, msg in problems:
        where = _format_loc(loc)
        lines.append(redact(f"{source}: {where}: {msg}" if where else f"{source}: {msg}"))
    raise ConfigError("\n".join(lines), lines) from None


# YAML ------------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that records duplicate mapping keys (PyYAML silently keeps the last one)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[int, str]] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            # Keys overridden after a `<<: *anchor` merge are intended, not duplicates.
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                self.duplicates.append((key_node.start_mark.line + 1, key_node.value))
            seen.add(key)
        return super().construct_mapping(node, deep)


def _load_yaml(text: str, source: str) -> Any:
    loader = _Loader(text)
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid YAML"
        if mark is None:
            raise ConfigError(redact(f"{source}: YAML syntax error: {problem}")) from None
        raise ConfigError(
            redact(f"{source}: line {mark.line + 1}: YAML syntax error: {problem} (column {mark.column + 1})")
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(redact(f"{source}: YAML error: {e}")) from None
    finally:
        loader.dispose()
    if loader.duplicates:
        lines = [
            f"{source}: line {line}: duplicate key {key!r} (each key may appear once per mapping)"
            for line, key in dict.fromkeys(loader.duplicates)
        ]
        raise ConfigError("\n".join(lines), lines)
    return data


# Interpolation -------------------------------------------------------------------------------------

# `$${` is an escaped literal `${`; `${NAME}` / `${NAME:-default}` are references; any other `${` is
# malformed (the optional group fails and only `${` matches).
_REFERENCE_RE = re.compile(
    r"\$\$\{|\$\{(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<sep>:-(?P<default>[^}]*))?\})?"
)


def _interpolate_tree(
    node: Any, loc: Loc, environ: Mapping[str, str], problems: list[tuple[Loc, str]]
) -> Any:
    # Interpolating the parsed tree (not the raw text) means a value with ':' or '#' can't change
    # the YAML structure, and the result is always the literal string.
    if isinstance(node, str):
        return _interpolate(node, loc, environ, problems) if "${" in node else node
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, (*loc, k), environ, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(v, (*loc, i), environ, problems) for i, v in enumerate(node)]
    return node


def _interpolate(text: str, loc: Loc, environ: Mapping[str, str], problems: list[tuple[Loc, str]]) -> str:
    def replace(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name = m.group("name")
        if name is None:
            problems.append(
                (
                    loc,
                    "invalid variable reference: use ${NAME} or ${NAME:-default} (write $${ for a literal ${)",
                )
            )
            return m.group(0)
        value = environ.get(name)
        if m.group("sep") is not None and not value:  # shell semantics: default when unset or empty
            return m.group("default")
        if value is None:
            problems.append((loc, f"environment variable {name} is not set"))
            return m.group(0)
        return value

    return _REFERENCE_RE.sub(replace, text)


# Validation errors -----------------------------------------------------------------------------------

# Paths under these keys may hold credentials: never show the offending input for them.
_SENSITIVE_KEYS = frozenset({"dsn", "url", "headers", "conf", "hmac_secret_env"})

_TYPE_MESSAGES: dict[str, str] = {
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, datetime | date):
        return "a date"
    return type(value).__name__


def _show(value: Any, sensitive: bool) -> str:
    if sensitive or isinstance(value, Mapping | list | tuple):
        return _kind(value)
    text = repr(value)
    return redact(text if len(text) <= 80 else text[:77] + "...")


def _validation_lines(exc: ValidationError, data: Any) -> list[tuple[Loc, str]]:
    lines: list[tuple[Loc, str]] = []
    for err in exc.errors(include_url=False):
        loc = _user_loc(err["loc"], data)
        ctx: dict[str, Any] = err.get("ctx") or {}
        kind = err["type"]
        if kind == _PROBLEMS:
            lines.extend(((*loc, *rel), msg) for rel, msg in ctx["problems"])
            continue
        sensitive = any(el in _SENSITIVE_KEYS for el in loc)
        got = f" (got {_show(err.get('input'), sensitive)})"
        if kind == "missing":
            lines.append((loc, "required key is missing"))
        elif kind == "extra_forbidden":
            lines.append((loc[:-1], _unknown_key(loc, data)))
        elif kind == "literal_error":
            lines.append((loc, f"must be one of {_one_of(ctx['expected'])}{got}"))
        elif kind == "union_tag_invalid":
            lines.append(((*loc, "type"), f"must be one of {ctx['expected_tags']} (got {ctx['tag']!r})"))
        elif kind == "union_tag_not_found":
            expected = ", ".join(repr(t) for t in _DESTINATION_TYPES)
            lines.append(((*loc, "type"), f"required key is missing (one of {expected})"))
        elif kind in _TYPE_MESSAGES:
            lines.append((loc, _TYPE_MESSAGES[kind] + got))
        elif kind in ("too_short", "string_too_short"):
            n = ctx.get("min_length", 1)
            lines.append((loc, "must not be empty" if n == 1 else f"must have at least {n} items"))
        elif kind in ("too_long", "string_too_long"):
            lines.append(
                (
                    loc,
                    f"must have at most {ctx.get('max_length')} {'characters' if 'string' in kind else 'items'}",
                )
            )
        elif kind in _BOUND_MESSAGES:
            key, words = _BOUND_MESSAGES[kind]
            bound = ctx[key]
            if isinstance(bound, float) and bound.is_integer():
                bound = int(bound)  # "greater than 0", not "0.0", for float fields
            lines.append((loc, f"must be {words} {bound}{got}"))
        elif kind in ("value_error", "assertion_error") and "error" in ctx:
            lines.append((loc, str(ctx["error"])))
        else:
            lines.append((loc, err["msg"]))
    return lines


_BOUND_MESSAGES: dict[str, tuple[str, str]] = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _one_of(expected: str) -> str:
    # pydantic writes "'a', 'b' or 'c'"; the contract's wording is "one of 'a', 'b', 'c'".
    head, sep, tail = expected.rpartition(" or ")
    return f"{head}, {tail}" if sep else expected


def _step(node: Any, el: str | int) -> Any:
    if isinstance(node, Mapping):
        return node.get(el)
    if isinstance(node, list) and isinstance(el, int) and 0 <= el < len(node):
        return node[el]
    return None


def _user_loc(loc: Sequence[str | int], data: Any) -> Loc:
    """Pydantic's location, minus elements the user never wrote (discriminated-union tags)."""
    out: list[str | int] = []
    node = data
    for el in loc:
        if el == "[key]":  # pydantic's marker for "the key itself"
            continue
        if isinstance(node, Mapping) and el not in node and node.get("type") == el:
            continue  # `destination.postgres.mode` -> `destination.mode`
        out.append(el)
        node = _step(node, el)
    return tuple(out)


def _unknown_key(loc: Loc, data: Any) -> str:
    key = loc[-1]
    allowed = _allowed_keys(loc[:-1], data)
    message = f"unknown key {str(key)!r}"
    if not allowed:
        return message
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
    if close:
        return f"{message} (did you mean {close[0]!r}?)"
    return f"{message} (allowed: {', '.join(allowed)})"


def _allowed_keys(loc: Loc, data: Any) -> list[str]:
    """The keys the model at ``loc`` accepts, found by walking the model types along the data."""
    annotation: Any = PipelineConfig
    node = data
    for el in loc:
        model = _resolve_model(annotation, node)
        if model is not None:
            field = next((f for name, f in model.model_fields.items() if el in (name, f.alias)), None)
            if field is None:
                return []
            annotation = field.annotation
        else:
            annotation = _strip_annotated(annotation)
            origin = get_origin(annotation)
            if origin is list and isinstance(el, int):
                annotation = get_args(annotation)[0]
            elif origin is dict:
                annotation = get_args(annotation)[1]
            else:
                return []
        node = _step(node, el)
    model = _resolve_model(annotation, node)
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _strip_annotated(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _resolve_model(annotation: Any, node: Any) -> type[BaseModel] | None:
    annotation = _strip_annotated(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        members = [_strip_annotated(a) for a in get_args(annotation) if a is not type(None)]
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if len(members) == 1:
            return _resolve_model(members[0], node)
        tag = node.get("type") if isinstance(node, Mapping) else None
        for model in models:  # discriminated union: pick the member whose `type` literal matches
            type_field = model.model_fields.get("type")
            if type_field is not None and tag in get_args(type_field.annotation):
                return model
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
