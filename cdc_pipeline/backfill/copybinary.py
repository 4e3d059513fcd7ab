"""PostgreSQL binary COPY: the fields of one tuple (pure). A page is relayed from the source to the state
database as binary COPY untouched; only its last tuple is looked at, for the page's cursor."""

from __future__ import annotations

import struct

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = len(SIGNATURE) + 8  # flags (int32) and header extension length (int32, 0 as PostgreSQL writes it)


def tuple_fields(chunk: bytes) -> list[bytes | None] | None:
    """Raw values of the tuple in one COPY data chunk (the first chunk also carries the file header);
    None for the trailer. libpq hands binary COPY out one tuple per chunk."""
    view = memoryview(chunk)
    pos = 0
    if view[:len(SIGNATURE)] == SIGNATURE:
        (ext,) = struct.unpack_from("!i", view, len(SIGNATURE) + 4)
        pos = _HEADER + ext
    (count,) = struct.unpack_from("!h", view, pos)
    if count == -1:
        return None
    pos += 2
    fields: list[bytes | None] = []
    for _ in range(count):
        (size,) = struct.unpack_from("!i", view, pos)
        pos += 4
        if size < 0:
            fields.append(None)
        else:
            fields.append(bytes(view[pos:pos + size]))
            pos += size
    return fields
