"""Webhook sink: POST batches of messages as JSON, optionally HMAC-signed.

This package is the whole `webhook` destination type: its config schema (here, light: loading a config
never imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from cdc_pipeline.config.base import ALIAS, ENV_NAME_RE, HEADER_NAME_RE, StrictModel, string_map
from cdc_pipeline.config.errors import Loc, fail
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class WebhookDestination(StrictModel):
    type: Literal["webhook"] = "webhook"
    url: str = Field(description="http(s) endpoint receiving `POST {\"data\": [message, ...]}`.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers (e.g. "
                                    "`Authorization: ${TOKEN}`); never shown in errors.")
    timeout_ms: int = Field(default=10000, gt=0, description="Total deadline per request (connect, send, "
                            "response); a timeout fails that request's messages.")
    hmac_secret_env: str | None = Field(default=None, description="NAME of the environment variable holding "
                                        "the signing secret (never the secret itself).")
    signature_header: str = Field(default="X-CDC-Signature", description="Receives the hex HMAC-SHA256 of the "
                                  "body; `<signature_header>-V2` the HMAC of `<X-CDC-Timestamp>.<body>`.")
    batch_size: int | None = Field(default=None, gt=0, description=ALIAS.format(key="batch_size"))
    max_in_flight: int | None = Field(default=None, gt=0, le=10000, description=ALIAS.format(key="max_in_flight"))
    http2: bool = Field(default=True, description="Speak HTTP/2 with an https endpoint that offers it (TLS "
                        "ALPN): the whole window on one connection; false: always HTTP/1.1.")

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


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.webhook.client import WebhookSink

    return WebhookSink(sink_config, environ=environ)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.webhook.client import WebhookSink

    return WebhookSink
