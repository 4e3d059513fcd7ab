"""Destination schemas: the `destination:` block of a sink, one model per sink type."""

from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    Field,
    field_validator,
)

from cdc_pipeline.config.base import (
    ENV_NAME_RE,
    HEADER_NAME_RE,
    Dsn,
    StrictModel,
    identifier,
    qualify,
    string_map,
    url_with_scheme,
)
from cdc_pipeline.config.errors import Loc, fail


class PostgresDestination(StrictModel):
    type: Literal["postgres"] = "postgres"
    dsn: Dsn = Field(min_length=1)
    table: str
    mode: Literal["mirror", "append"] = "mirror"
    # Schemas a data-driven `route` may name (None: any). A route elsewhere parks its message.
    route_schemas: list[str] | None = Field(default=None, min_length=1)

    @field_validator("route_schemas")
    @classmethod
    def _check_route_schemas(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [identifier(v) for v in value]

    @field_validator("table")
    @classmethod
    def _check_table(cls, value: str) -> str:
        # '{schema}' and '{table}' stand for the source table's, so one mirror sink can serve many tables.
        probe = value.replace("{schema}", "s").replace("{table}", "t")
        qualify(probe)
        return value if "." in value else f"public.{value}"


class WebhookDestination(StrictModel):
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
        return string_map(value)

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
            if not HEADER_NAME_RE.match(name):
                problems.append(((name,), "is not a valid HTTP header name"))
            elif "\r" in header or "\n" in header:  # header injection
                problems.append(((name,), "must not contain line breaks"))
        if problems:
            fail(*problems)
        return value

    @field_validator("hmac_secret_env")
    @classmethod
    def _check_secret_env(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME_RE.match(value):
            # Deliberately does not echo the value: it is probably the secret itself.
            raise ValueError(
                "must be the NAME of an environment variable holding the secret "
                "(e.g. WEBHOOK_SECRET), never the secret itself"
            )
        return value

    @field_validator("signature_header")
    @classmethod
    def _check_signature_header(cls, value: str) -> str:
        if not HEADER_NAME_RE.match(value):
            raise ValueError(f"is not a valid HTTP header name (got {value!r})")
        return value


class RedisStreamDestination(StrictModel):
    type: Literal["redis_stream"] = "redis_stream"
    url: str = "redis://127.0.0.1:6379/0"
    stream_key: str = Field(default="cdc", min_length=1)
    maxlen: int | None = Field(default=None, gt=0)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return url_with_scheme(value, ("redis", "rediss", "unix"))


class NatsDestination(StrictModel):
    type: Literal["nats"] = "nats"
    url: str = "nats://127.0.0.1:4222"
    subject: str = Field(default="cdc", min_length=1)
    stream: str = Field(default="CDC", min_length=1)
    ack_timeout_ms: int = Field(default=5000, gt=0)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return url_with_scheme(value, ("nats", "tls", "ws", "wss"))

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


class RabbitMQDestination(StrictModel):
    type: Literal["rabbitmq"] = "rabbitmq"
    url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    exchange: str = "cdc"
    exchange_type: Literal["topic", "direct", "fanout", "headers"] = "topic"
    routing_key: str = "cdc"

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return url_with_scheme(value, ("amqp", "amqps"))


class ParquetDestination(StrictModel):
    type: Literal["parquet"] = "parquet"
    path: str = Field(min_length=1)


class HttpPullDestination(StrictModel):
    """Messages wait in the state database until a consumer pulls them from `cdc-pipeline serve`."""

    type: Literal["http_pull"] = "http_pull"
    token_env: str  # NAME of the environment variable holding the consumers' bearer token
    visibility_timeout_ms: int = Field(default=30000, gt=0)
    max_deliveries: int | None = Field(default=None, gt=0)  # None = hand a message out forever

    @field_validator("token_env")
    @classmethod
    def _check_token_env(cls, value: str) -> str:
        if not ENV_NAME_RE.match(value):
            # Deliberately does not echo the value: it is probably the token itself.
            raise ValueError("must be the NAME of an environment variable holding the token "
                             "(e.g. PULL_TOKEN), never the token itself")
        return value


Destination = Annotated[
    PostgresDestination
    | WebhookDestination
    | RedisStreamDestination
    | NatsDestination
    | RabbitMQDestination
    | ParquetDestination
    | HttpPullDestination,
    Field(discriminator="type"),
]
DESTINATION_TYPES: tuple[str, ...] = tuple(
    get_args(model.model_fields["type"].annotation)[0] for model in get_args(get_args(Destination)[0])
)
