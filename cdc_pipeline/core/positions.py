"""A place in the change log: (commit_lsn, commit_idx), ordered as the log is."""

from __future__ import annotations

Position = tuple[int, int]

# Before the first entry of the log: where a sink that has delivered nothing stands.
START: Position = (0, -1)
# After every entry the log can hold (the largest bigint and integer): an open upper bound.
END: Position = (2**63 - 1, 2**31 - 1)


def position_text(position: Position) -> str:
    """The position as status and metadata show it: 'commit_lsn:commit_idx'."""
    return f"{position[0]}:{position[1]}"
