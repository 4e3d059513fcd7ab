"""PostgreSQL COPY text format, one line -> field values (pure). Used for the last row of a page only."""

from __future__ import annotations

_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def parse_line(line: bytes) -> list[str | None]:
    """Fields of one COPY TO text-format row (tab-separated, ``\\N`` for NULL, backslash escapes)."""
    text = line.decode()
    if text.endswith("\n"):
        text = text[:-1]
    return [None if field == "\\N" else _unescape(field) for field in text.split("\t")]


def _unescape(field: str) -> str:
    if "\\" not in field:
        return field
    out: list[str] = []
    i, n = 0, len(field)
    while i < n:
        c = field[i]
        if c != "\\" or i + 1 == n:
            out.append(c)
            i += 1
            continue
        nxt = field[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "01234567":
            j = i + 1
            while j < min(n, i + 4) and field[j] in "01234567":
                j += 1
            out.append(chr(int(field[i + 1:j], 8)))
            i = j
        elif nxt == "x" and i + 2 < n and field[i + 2] in "0123456789abcdefABCDEF":
            j = i + 2
            while j < min(n, i + 4) and field[j] in "0123456789abcdefABCDEF":
                j += 1
            out.append(chr(int(field[i + 2:j], 16)))
            i = j
        else:  # any other escaped character stands for itself
            out.append(nxt)
            i += 2
    return "".join(out)
