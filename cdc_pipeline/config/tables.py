"""Table config: names, sort and group columns, partitions."""

from datetime import date, datetime
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from cdc_pipeline.config.base import StrictModel, identifier, qualify
from cdc_pipeline.config.errors import Loc, fail

PartitionKind = Literal["daily", "hourly", "weekly", "monthly", "integer"]


class PartitionsConfig(StrictModel):
    kind: PartitionKind = Field(default="daily", description="`hourly`, `daily`, `weekly`, `monthly` (UTC) "
                                "windows of a time sort column, or `integer` windows.")
    start: str = Field(description="First partition's start (a date or datetime, or an integer for `integer`).")
    end: str | None = Field(default=None, description="End, exclusive; required for `integer`; default: open "
                            "ended (time kinds).")
    step: int | None = Field(default=None, gt=0, description="`integer` only: width of a partition; default "
                             "(end - start) / 100.")

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
            fail(*problems)
        return self


class TableConfig(StrictModel):
    name: str = Field(description="`schema.table`, or `table` meaning `public.table`.")
    sort_column: str | None = Field(default=None, description="Column of partial backfills and partitions "
                                    "(rows where it is NULL are in no partition).")
    group_columns: list[str] | None = Field(default=None, min_length=1, description="Record columns that group "
                                            "messages for ordering; default: the primary key. They must be in the "
                                            "table's replica identity (in practice `REPLICA IDENTITY FULL`): a "
                                            "delete's old tuple carries only the identity (`check` reports it).")
    partitions: PartitionsConfig | None = Field(default=None, description="Dagster partitions of the table's "
                                                "backfill asset; requires `sort_column`.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        # Normalized to 'schema.table' so names compare equal however they were written.
        return qualify(value)

    @field_validator("sort_column")
    @classmethod
    def _check_sort_column(cls, value: str | None) -> str | None:
        return None if value is None else identifier(value)

    @field_validator("group_columns")
    @classmethod
    def _check_group_columns(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        problems: list[tuple[Loc, str]] = []
        seen: set[str] = set()
        for i, column in enumerate(value):
            try:
                identifier(column)
            except ValueError as e:
                problems.append(((i,), str(e)))
            if column in seen:
                problems.append(((i,), f"column {column!r} is listed twice"))
            seen.add(column)
        if problems:
            fail(*problems)
        return value

    @model_validator(mode="after")
    def _partitions_need_sort_column(self) -> "TableConfig":
        if self.partitions is not None and self.sort_column is None:
            fail((("partitions",), "requires sort_column (partitions are windows of the sort column)"))
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

