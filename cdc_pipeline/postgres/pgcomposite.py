"""PostgreSQL composite (row) literals, as record_out prints them, -> their fields. Pure: no I/O.

Fields are separated by commas inside parentheses; an empty unquoted field is NULL; a field in double quotes
may hold anything, a doubled quote or a backslash escaping the next character (record_in's rules).
"""

from __future__ import annotations

__all__ = ["parse_record"]


def parse_record(text: str) -> list[str | None]:
    """The fields of a composite literal, NULL fields as None."""
    if len(text) < 2 or text[0] != "(" or text[-1] != ")":
        raise ValueError(f"malformed record literal: {text[:50]!r}")
    fields: list[str | None] = []
    i, end = 1, len(text) - 1
    while True:
        if i >= end or text[i] == ",":  # an empty field: NULL
            fields.append(None)
        else:
            out: list[str] = []
            quoted = False
            while i < end:
                c = text[i]
                if c == "\\" and i + 1 < len(text):
                    out.append(text[i + 1])
                    i += 2
                elif c == '"':
                    if quoted and i + 1 < end and text[i + 1] == '"':
                        out.append('"')
                        i += 2
                    else:
                        quoted = not quoted
                        i += 1
                elif c == "," and not quoted:
                    break
                else:
                    out.append(c)
                    i += 1
            if quoted:
                raise ValueError(f"unterminated quote in record literal: {text[:50]!r}")
            fields.append("".join(out))
        if i >= end:
            return fields
        i += 1  # past the comma
        if i == end:  # a trailing empty field
            fields.append(None)
            return fields
