"""One line of `cdc-pipeline check` output: a level, what it is about, and what to do."""

from __future__ import annotations

from dataclasses import dataclass

# "error" blocks capture (check exits 1); "todo" is what `cdc-pipeline setup` will create;
# "warning" works but loses something (the message says what); "ok" is a passed check.
LEVELS = ("error", "warning", "todo", "ok")


@dataclass(frozen=True)
class Finding:
    level: str  # one of LEVELS
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.level.upper():7} {self.subject}: {self.message}"
