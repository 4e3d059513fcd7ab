"""What every store of the state schema shares: the schema's name, and positions in the change log."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from cdc_pipeline.core.positions import Position

__all__ = ["Position", "SchemaStore", "StateError"]


class StateError(Exception):
    """The state database's error, raised through a sink's code (a table description it asked for, a run
    relayed into it): a sink counts every psycopg error as its destination's, this passes it on. The
    original error is the cause."""


@dataclass(frozen=True)
class SchemaStore:
    """SQL about the tables of one state schema; `s` is the schema as an identifier for composed SQL."""

    schema: str

    @property
    def s(self) -> sql.Identifier:
        return sql.Identifier(self.schema)
