"""PostgreSQL sink: mirror or append changes into a table of another database.

This package is the whole `postgres` destination type: its config schema (here, light: loading a config
never imports the client library) and its client (`client.py`, imported only when the sink is built).
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from cdc_pipeline.config.base import Dsn, StrictModel, identifier, qualify
from cdc_pipeline.sinks.base import Sink, SinkConfigLike

# The schema in the destination database where the sink keeps its position (client.py).
OFFSETS_SCHEMA = "cdc_pipeline_sink"


class PostgresDestination(StrictModel):
    type: Literal["postgres"] = "postgres"
    dsn: Dsn = Field(min_length=1, description="The destination database; its own role, with `CREATE` on the "
                     "target schemas.")
    table: str = Field(description="Target table (`schema.table`); may contain `{schema}` and `{table}`, the "
                       "source table's, so one sink serves several tables.")
    mode: Literal["mirror", "append"] = Field(default="mirror", description="`mirror`: the table follows the "
                                              "source (upserts, deletes, truncates, added/dropped columns); "
                                              "`append`: one row per message, keyed by its idempotency key.")
    route_schemas: list[str] | None = Field(default=None, min_length=1, description="Schemas a data-driven "
                                            "`route` may name (null: any but system schemas); a route elsewhere "
                                            "parks its message.")

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


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.postgres.client import PostgresSink

    return PostgresSink(sink_config)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.postgres.client import PostgresSink

    return PostgresSink
