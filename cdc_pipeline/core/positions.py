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


def lsn_text(lsn: int) -> str:
    """An LSN in PostgreSQL's notation ('16/B374D848'), as pg_lsn, the server's logs and `status` show it."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def position_lsn_text(position: Position) -> str:
    """A position in PostgreSQL's LSN notation with its index: '16/B374D848:3' (the UI's and logs' form;
    'commit_lsn:commit_idx' stays the message ID and the data version)."""
    return f"{lsn_text(position[0])}:{position[1]}"


def parse_position(text: str) -> Position | None:
    """A message ID as `failed` and the UI take it: 'commit_lsn:commit_idx' or 'X/Y:commit_idx'; None if
    it is neither."""
    lsn, colon, idx = text.strip().rpartition(":")
    if not colon or not idx.lstrip("-").isdigit():
        return None
    high, slash, low = lsn.partition("/")
    try:
        value = (int(high, 16) << 32 | int(low, 16)) if slash else int(lsn)
    except ValueError:
        return None
    return (value, int(idx)) if 0 <= value < 2**64 and (not slash or int(low, 16) <= 0xFFFFFFFF) else None
