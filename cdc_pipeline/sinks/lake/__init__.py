"""What the lakehouse sinks (`delta`, `iceberg`) share: their common config keys (here, light: pydantic only),
the pure cores (effects.py: a batch reduced to one effect per key; values.py: PostgreSQL types and values to
Arrow), the rows they write (rows.py), their own record of their position (position.py) and the sink loop
(sink.py) each format's client plugs its reads and commits into.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from cdc_pipeline.config.base import StrictModel

DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024


class LakeOptions(StrictModel):
    """Keys every lake destination has (mixed into each type's model)."""

    table: str = Field(default="{schema}.{table}", min_length=1, description="The lake table's name; `{schema}` "
                       "and `{table}` stand for the source table's, so one sink serves several tables.")
    mode: Literal["mirror", "append"] = Field(default="mirror", description="`mirror`: the table equals the "
                                              "source (upserts by primary key, deletes, truncates, added columns); "
                                              "`append`: one row per message (the change history).")
    partition_by: list[str] = Field(default_factory=list, description="Columns the lake table is partitioned by "
                                    "(in `append` mode also `action`, `commit_date`); applied when the table is "
                                    "created.")
    flush_seconds: float = Field(default=10.0, ge=0, description="While the log is caught up, a commit at most this "
                                 "often (rows gathered in between), so a trickle of changes does not make a file per "
                                 "message; a backlog is written in calls of the sink's `batch_size`.")
    target_file_size: int = Field(default=DEFAULT_TARGET_FILE_SIZE, gt=0, description="Bytes a data file is written "
                                  "up to (and what the maintenance command, `python -m cdc_pipeline.sinks.lake.maintain`, compacts small files into).")

    @field_validator("table")
    @classmethod
    def _check_table(cls, value: str) -> str:
        probe = value.replace("{schema}", "s").replace("{table}", "t")
        if "{" in probe or "}" in probe:
            raise ValueError("only {schema} and {table} may stand in the table name")
        return value

    def table_for(self, source_table: str) -> str:
        schema, _, name = source_table.partition(".")
        return self.table.replace("{schema}", schema).replace("{table}", name)
