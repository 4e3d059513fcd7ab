"""Retry or discard a sink's failed messages, by ID, by source table or all: what the Dagster jobs
`retry_failed_messages_<sink>` / `discard_failed_messages_<sink>` run (defs/failed.py). The CLI's
`failed retry|discard` does the same by ID or --all.

A message named by ID is revived whatever its status (as in the CLI); a table's or all messages are the
parked ones, and discarded ones too only with ``include_discarded``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc_pipeline.config import ConfigError, PipelineConfig
from cdc_pipeline.core.positions import Position, parse_position
from cdc_pipeline.postgres import session
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.pull_queue import PullQueue

ACTIONS = ("retry", "discard")


@dataclass(frozen=True)
class Selection:
    """Which failed messages: `ids` (positions), every one of `table`, or `every` one of the sink."""

    ids: tuple[Position, ...] = ()
    table: str | None = None
    every: bool = False

    @classmethod
    def parse(cls, ids: list[str], table: str | None, every: bool) -> Selection:
        """From a run config; a clear error naming the field when it is not exactly one of the three."""
        given = [name for name, value in (("ids", ids), ("table", table), ("all", every)) if value]
        if len(given) != 1:
            raise ConfigError(f"give exactly one of ids, table or all (got {', '.join(given) or 'none'})")
        positions = []
        for text in ids:
            position = parse_position(text)
            if position is None:
                raise ConfigError(f"ids: {text!r} is not a message ID like 24681234:3 (or 0/178A8F2:3)")
            positions.append(position)
        if table is not None and "." not in table:
            raise ConfigError(f"table: {table!r} is not schema.table")
        return cls(tuple(positions), table, every)


@dataclass
class Outcome:
    matched: int = 0
    revived_discarded: int = 0
    missing: list[Position] = field(default_factory=list)  # IDs that named no failed message


def act(pipeline: PipelineConfig, sink: str, action: str, selection: Selection,
        include_discarded: bool = False) -> Outcome:
    """Make the selected messages due for retry now, or discard them; committed at once."""
    if action not in ACTIONS:
        raise ConfigError(f"action: {action!r} is not one of {', '.join(ACTIONS)}")
    sink_config = pipeline.sink(sink)
    if selection.table is not None and selection.table not in sink_config.tables:
        raise ConfigError(f"table: {selection.table!r} is not a table of sink {sink} "
                          f"({', '.join(sink_config.tables)})")
    failed, pull = FailedMessages(pipeline.state.schema_name), PullQueue(pipeline.state.schema_name)
    outcome = Outcome()
    with session.connect(pipeline.state_dsn) as conn:
        if selection.every:
            targets: list[Position | None] = [None]
        elif selection.table is not None:
            targets = list(failed.positions_of_table(conn, sink, selection.table,
                                                     include_discarded and action == "retry"))
        else:
            targets = list(selection.ids)
        for position in targets:
            if action == "retry":
                revive = include_discarded or bool(selection.ids)
                n, revived = failed.retry_now(conn, sink, position, revive)
                n += pull.unpark(conn, sink, position)
            else:
                n, revived = failed.discard_now(conn, sink, position) + len(pull.drop_parked(conn, sink, position)), 0
            outcome.matched += n
            outcome.revived_discarded += revived
            if not n and position is not None and selection.ids:
                outcome.missing.append(position)
        conn.commit()
    return outcome
