"""A batch of messages as one block of COPY text for the Postgres sink's staging table.

psycopg's ``write_row`` adapts every field of every row in Python; the staging rows are plain integers,
short keys and the message's JSON bytes, so they are assembled here with bytes operations (C loops) and
written in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdc_pipeline.sinks.base import OutboundMessage

_NULL = b"\\N"


def _escape(value: bytes) -> bytes:
    """COPY text escaping: backslash first, then the three characters that end a field or a row."""
    if b"\\" in value:
        value = value.replace(b"\\", b"\\\\")
    if b"\n" in value:
        value = value.replace(b"\n", b"\\n")
    if b"\r" in value:
        value = value.replace(b"\r", b"\\r")
    if b"\t" in value:
        value = value.replace(b"\t", b"\\t")
    return value


def _text(value: str | None) -> bytes:
    return _NULL if value is None else _escape(value.encode())


def stage_block(batch: Sequence[OutboundMessage]) -> tuple[bytes, tuple[int, int]]:
    """COPY text of ``(seq, lsn, idx, grp, route, msg)`` for every message, and the batch's last position."""
    lines: list[bytes] = []
    last = (0, -1)
    for seq, m in enumerate(batch):
        lsn, _, idx = m.key.partition(":")
        pos = (int(lsn), int(idx))
        if pos > last:
            last = pos
        lines.append(b"%d\t%d\t%d\t%s\t%s\t%s\n" % (seq, pos[0], pos[1], _text(m.group), _text(m.route),
                                                     _escape(m.payload)))
    return b"".join(lines), last
