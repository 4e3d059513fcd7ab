"""PostgreSQL array literals (array_out's text form) -> nested Python lists. Pure: no I/O.

Used by the decoder (pgtypes.py) for array columns, with a per-type parser for the elements.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from itertools import product
from typing import Final, TypeAlias

__all__ = ["ElementParser", "parse_array"]

# Exactly the characters array_in/array_out treat as whitespace; str.isspace()/\s would also match
# e.g. U+00A0, which PostgreSQL leaves unquoted inside elements.
_WS = " \t\n\r\v\f"
_NEEDS_GENERAL_PARSER: Final = re.compile(rf'["\\{_WS}]')


@cache
def _token(delimiter: str) -> re.Pattern[str]:
    """The tokenizer for arrays whose elements are separated by ``delimiter`` (pg_type.typdelim: ',' for
    every built-in type but box, ';')."""
    d = re.escape(delimiter)
    return re.compile(
        rf"""[{_WS}]*(?:
            (?P<open>\{{) | (?P<close>\}}) | (?P<comma>{d})
          | "(?P<quoted>(?:[^"\\]|\\.)*)"
          | (?P<bare>(?:[^{{}}{d}"\\{_WS}]|\\.)+(?:[{_WS}]+(?:[^{{}}{d}"\\{_WS}]|\\.)+)*)
        )[{_WS}]*""",
        re.VERBOSE | re.DOTALL,
    )


_UNESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)
# Unquoted NULL is case-insensitive in array_in; a set of all 16 spellings is one hash lookup.
_NULLS: Final = frozenset("".join(chars) for chars in product(*zip("NULL", "null", strict=True)))

ElementParser: TypeAlias = Callable[[str], object] | None  # None: elements stay str


def parse_array(text: str, element: ElementParser = None, delimiter: str = ",") -> list[object]:
    """Parse a PostgreSQL array literal into (nested) lists; NULL elements become None.

    ``element`` converts each non-NULL element string. Explicit bounds decoration ("[0:1]={...}",
    printed when a lower bound is not 1) is accepted and dropped: Python lists are 0-based anyway.
    """
    if text[:1] == "[":
        eq = text.find("=")
        if eq < 0:
            raise ValueError(f"malformed array literal: {text[:50]!r}")
        text = text[eq + 1 :]
    if (
        _NEEDS_GENERAL_PARSER.search(text) is None
        and text[:1] == "{"
        and text[-1:] == "}"
        and text.find("{", 1) < 0
        and text.find("}", 1, -1) < 0
    ):
        # Fast path, the common output shape: one dimension, nothing quoted or escaped.
        if text == "{}":
            return []
        items = text[1:-1].split(delimiter)
        if "" in items:
            raise ValueError(f"malformed array literal: {text[:50]!r}")
        if element is None:
            return [None if item in _NULLS else item for item in items]
        return [None if item in _NULLS else element(item) for item in items]
    return _parse_array_general(text, element, delimiter)


def _parse_array_general(text: str, element: ElementParser, delimiter: str = ",") -> list[object]:
    match = _token(delimiter).match
    end = len(text)
    pos = 0
    root: list[object] | None = None
    stack: list[list[object]] = []
    # Per open level: did it receive sub-arrays (True), scalars (False), or nothing yet (None)?
    # Tracked apart from the values because a json element may itself convert to a list.
    nested: list[bool | None] = []
    # True when the next token must be an element or '{' (after '{' or ','), False after an element.
    expect_item = True
    # After '{' a '}' is allowed immediately (empty array); after ',' it is not.
    allow_close = False
    while pos < end:
        m = match(text, pos)
        if m is None:
            raise ValueError(f"malformed array literal at offset {pos}: {text[:50]!r}")
        pos = m.end()
        kind = m.lastgroup
        if root is not None:
            raise ValueError(f"junk after array literal: {text[:50]!r}")
        if kind == "open":
            if not expect_item:
                raise ValueError(f"unexpected '{{' at offset {m.start()}: {text[:50]!r}")
            new: list[object] = []
            if stack:
                if nested[-1] is False:
                    raise ValueError(f"mixed dimensions in array literal: {text[:50]!r}")
                nested[-1] = True
                stack[-1].append(new)
            stack.append(new)
            nested.append(None)
            expect_item, allow_close = True, True
        elif kind == "close":
            if not stack or (expect_item and not allow_close):
                raise ValueError(f"unexpected '}}' at offset {m.start()}: {text[:50]!r}")
            done = stack.pop()
            nested.pop()
            if not stack:
                root = done
            expect_item, allow_close = False, False
        elif kind == "comma":
            if expect_item or not stack:
                raise ValueError(f"unexpected ',' at offset {m.start()}: {text[:50]!r}")
            expect_item, allow_close = True, False
        else:
            if not expect_item or not stack or nested[-1]:
                raise ValueError(f"unexpected element at offset {m.start()}: {text[:50]!r}")
            nested[-1] = False
            stack[-1].append(_element_value(kind, m.group(kind), element))
            expect_item, allow_close = False, False
    if root is None:
        raise ValueError(f"unterminated array literal: {text[:50]!r}")
    return root


def _element_value(kind: str, raw: str, element: ElementParser) -> object:
    """A scalar token's value: only an unquoted, unescaped NULL is SQL NULL; escapes are undone before
    ``element`` converts it."""
    if kind == "bare" and "\\" not in raw and raw in _NULLS:
        return None
    if "\\" in raw:
        raw = _UNESCAPE.sub(r"\1", raw)
    return raw if element is None else element(raw)
