"""Sink config: tables, actions, filter/transform/route, grouping, retries, destination."""

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from cdc_pipeline.config.base import CALLABLE_RE, Name, StrictModel, qualify
from cdc_pipeline.config.destinations import Destination
from cdc_pipeline.config.errors import Loc, fail, kind_of
from cdc_pipeline.core.lanes import MAX_LANES


class BackoffConfig(StrictModel):
    initial_ms: int = Field(default=1000, gt=0, description="Delay before a parked message's first retry.")
    max_ms: int = Field(default=300000, gt=0, description="Cap of the retry delay; at least `initial_ms`.")
    multiplier: float = Field(default=2.0, ge=1, description="Each retry waits `initial_ms x "
                              "multiplier^(attempt-1)`, capped at `max_ms`.")
    jitter: float = Field(default=0.2, ge=0, le=1, description="Random spread of each delay, as a fraction "
                          "(0.2 = +/- 20%).")

    @model_validator(mode="after")
    def _check_range(self) -> "BackoffConfig":
        if self.max_ms < self.initial_ms:
            fail((("max_ms",), f"must be at least initial_ms ({self.initial_ms}) (got {self.max_ms})"))
        return self


ALIASED_KEYS = ("batch_size", "max_in_flight")  # under `destination:` for some types, before they were the sink's

Action = Literal["insert", "update", "delete"]


class EnrichmentConfig(StrictModel):
    """One query per batch against the source (delivery/enrichment.py): `$1`, `$2`, ... are arrays of the
    batch's primary key values of `table`, one per key column; it must select those key columns."""

    table: str = Field(description="The sink's table whose key values the query receives (`schema.table`).")
    sql: str = Field(min_length=1, description="The query: `$1`, `$2`, ... are arrays of the batch's key values; "
                     "it selects the key columns and the columns to add.")
    statement_timeout_ms: int = Field(default=5000, gt=0, description="Time limit of the query; a failure is an "
                                      "outage of the source (waited for).")

    @field_validator("table")
    @classmethod
    def _qualify(cls, value: str) -> str:
        return qualify(value)

    @field_validator("sql")
    @classmethod
    def _check_sql(cls, value: str) -> str:
        if "$1" not in value:
            raise ValueError("must use $1 (the array of the batch's primary key values), e.g. "
                             "SELECT o.id, c.name FROM orders o JOIN customers c ON c.id = o.customer_id "
                             "WHERE o.id = ANY($1)")
        return value


class SinkConfig(StrictModel):
    name: Name = Field(description="The sink's name (1-63 letters, digits, `_`, `-`): names its offset, locks, "
                       "Dagster asset `sink/<name>` and job `deliver_<name>`.")
    tables: list[str] = Field(min_length=1, description="Tables it receives (`schema.table` or `table`, meaning "
                              "`public.table`); each must be under `tables:`.")
    actions: list[Action] = Field(default_factory=lambda: ["insert", "update", "delete"], min_length=1,
                                  description="Change actions it receives; backfill `read` messages always pass.")
    filter: str | None = Field(default=None, min_length=1, description="Spark SQL boolean expression over "
                               "`record`, `changes`, `action`, `metadata`; messages it is not true for are "
                               "skipped.")
    transform: str | dict[str, str] | None = Field(default=None, description="A mapping of output field to Spark "
                                                   "SQL expression (the message body becomes those fields), or "
                                                   "`\"package.module:function\"` (DataFrame -> DataFrame).")
    route: str | None = Field(default=None, min_length=1, description="Spark SQL expression giving each "
                              "message's destination (stream key, subject, routing key, append table).")
    message_grouping: bool = Field(default=True, description="Order messages per group (the primary key, or the "
                                   "table's `group_columns`); `false` turns ordering off.")
    max_retries: int | None = Field(default=None, ge=0, description="Retries of a parked message before it is "
                                    "discarded; null: retry forever.")
    backoff: BackoffConfig = Field(default_factory=BackoffConfig, description="Retry delays of parked messages.")
    batch_size: int | None = Field(default=None, gt=0, description="Messages per call to the sink: a webhook "
                                   "request, an SQS batch, a transaction, a run of publishes. Default: the destination "
                                   "type's own (webhook 1000, typesense 100, sqs and sns 10, kinesis 500), else "
                                   "`delivery.batch_size`. Replaces `destination.batch_size` (a deprecated alias).")
    max_in_flight: int | None = Field(default=None, ge=1, le=10000, description="Calls out at once (a group's next "
                                      "message only after its previous one's outcome): only for the types whose "
                                      "calls are requests (webhook, default 100; sqs, sns, kinesis, 10; typesense, "
                                      "4); the others take one call at a time. Replaces `destination.max_in_flight` "
                                      "(a deprecated alias).")
    lanes: int = Field(default=1, ge=1, le=MAX_LANES, description="Delivery lanes: the sink's messages split by a "
                       "stable hash of their group, each lane with its own offset, parked messages and process "
                       "(`deliver --sink S --lane I`, or a Dagster run per lane). Changing it is safe at any time.")
    stream: Literal["changes", "rows"] = Field(default="changes", description="`changes`: every change with "
                                               "`action` and `changes`; `rows`: the latest version of each "
                                               "changed row, coalesced per batch.")
    deletes: bool = Field(default=False, description="Row streams only: send `{\"record\": <key>, \"deleted\": "
                          "true}` for a deleted row.")
    enrichment: EnrichmentConfig | None = Field(default=None, description="Columns from other tables of the "
                                                "source, joined into each message's `metadata.enrichment`: one "
                                                "query per batch.")
    destination: Destination = Field(description="Where it sends: one of the destination types below, chosen by "
                                     "`type`.")

    @field_validator("tables")
    @classmethod
    def _check_tables(cls, value: list[str]) -> list[str]:
        problems: list[tuple[Loc, str]] = []
        out: list[str] = []
        for i, name in enumerate(value):
            try:
                qualified = qualify(name)
            except ValueError as e:
                problems.append(((i,), str(e)))
                continue
            if qualified in out:
                problems.append(((i,), f"table '{qualified}' is listed twice"))
            out.append(qualified)
        if problems:
            fail(*problems)
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
            if not CALLABLE_RE.match(value):
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
                fail(*problems)
            return out
        raise ValueError(
            "must be 'package.module:function' or a mapping of output field to Spark SQL expression "
            f"(got {kind_of(value)})"
        )


    @model_validator(mode="before")
    @classmethod
    def _fold_aliases(cls, data: Any) -> Any:
        """`destination.batch_size` / `destination.max_in_flight` (deprecated; loading warns) are the sink's."""
        dest = data.get("destination") if isinstance(data, Mapping) else None
        if not isinstance(dest, Mapping) or not any(key in dest for key in ALIASED_KEYS):
            return data
        return {**data, **{key: dest[key] for key in ALIASED_KEYS if dest.get(key) is not None}}

    @model_validator(mode="after")
    def _check_in_flight(self) -> "SinkConfig":
        if (self.max_in_flight or 1) > 1 and "max_in_flight" not in type(self.destination).model_fields:
            fail((("max_in_flight",), f"a {self.destination.type} sink takes one call at a time (got "
                  f"{self.max_in_flight}): remove the key"))
        return self

    @model_validator(mode="after")
    def _check_route(self) -> "SinkConfig":
        kind = self.destination.type
        if self.route is not None and kind in ("delta", "iceberg"):  # a lake table is its source table's
            fail((("route",), f"a {kind} sink writes each source table to its own lake table (destination.table's "
                  "pattern) and takes no route: remove the key"))
        return self

    @model_validator(mode="after")
    def _check_enrichment(self) -> "SinkConfig":
        if self.enrichment is not None and self.enrichment.table not in self.tables:
            fail((("enrichment", "table"), f"must be one of the sink's tables ({', '.join(self.tables)}) "
                  f"(got {self.enrichment.table!r})"))
        return self
