"""Typesense sink: each row a document of a collection (one per table, or the route's), upserted by its key,
deleted on delete; a TRUNCATE empties the collection.

This package is the whole `typesense` destination type: its config schema (here, light), the pure
document and schema building (`documents.py`) and the client (`client.py`, imported only when the sink is
built). The keys follow Sequin's typesense sink (`endpoint_url`, `collection_name`, `api_key`,
`timeout_seconds`; Sequin's `batch_size` is the sink's).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from cdc_pipeline.config.base import ALIAS, StrictModel, url_with_scheme
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class TypesenseDestination(StrictModel):
    type: Literal["typesense"] = "typesense"
    endpoint_url: str = Field(description="The Typesense server, `http(s)://host:port`.")
    api_key: SecretStr = Field(description="API key with write access to the collections (e.g. "
                               "`${TYPESENSE_API_KEY}`).")
    collection_name: str | None = Field(default=None, min_length=1, description="Collection of every message "
                                        "without a route; none: one per table, named `schema.table`.")
    batch_size: int | None = Field(default=None, gt=0, le=10_000, description=ALIAS.format(key="batch_size"))
    max_in_flight: int | None = Field(default=None, ge=1, le=100, description=ALIAS.format(key="max_in_flight"))
    timeout_seconds: float = Field(default=10, gt=0, description="Connect and read timeout of each request; one not "
                                   "answered in time is retried later (not counted against its messages).")
    route_prefixes: list[str] | None = Field(default=None, description="A route (a collection name) must start "
                                             "with one of these; none: any collection.")

    @field_validator("endpoint_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return url_with_scheme(value, ("http", "https"))


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.typesense.client import TypesenseSink

    return TypesenseSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.typesense.client import TypesenseSink

    return TypesenseSink
