"""Webhook sink: POST batches of messages as JSON, optionally HMAC-signed.

This package is the whole `webhook` destination type: its config schema (here, light: loading a config
never imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from cdc_pipeline.config.base import ENV_NAME_RE, HEADER_NAME_RE, StrictModel, string_map
from cdc_pipeline.config.errors import Loc, fail
from cdc_pipeline.sinks.base import Sink, SinkConfigLike

MAX_IN_FLIGHT = 100  # requests outstanding at once by default: 5,000 requests/s at 20 ms each


class WebhookDestination(StrictModel):
    type: Literal["webhook"] = "webhook"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_ms: int = Field(default=10000, gt=0)
    hmac_secret_env: str | None = None  # NAME of an environment variable holding the secret
    signature_header: str = "X-CDC-Signature"
    batch_size: int = Field(default=1000, gt=0)
    # Requests outstanding at once (a sliding window; a group's next request waits for its previous one).
    max_in_flight: int = Field(default=MAX_IN_FLIGHT, gt=0, le=10000)

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
