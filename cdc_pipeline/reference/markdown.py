"""Small Markdown helpers shared by the generated pages."""

from __future__ import annotations

from collections.abc import Sequence


def cell(text: str) -> str:
    """A table cell: one line, no pipe (Markdown tables split on it)."""
    return " ".join(text.split()).replace("|", "&#124;")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def code(text: str) -> str:
    """Inline code that survives backticks inside."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"
