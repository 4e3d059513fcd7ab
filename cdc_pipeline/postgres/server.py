"""What the source server's PostgreSQL version enables or lacks for change data capture (pure, no I/O).

The drain reads pgoutput with logical messages (heartbeats, backfill watermarks, annotations), which
PostgreSQL 14 added: 14 is the oldest version supported.
"""

from __future__ import annotations

from dataclasses import dataclass

OLDEST_SUPPORTED = 140000

# (server_version_num from which it holds, what it enables): in order.
FEATURES: tuple[tuple[int, str, str], ...] = (
    (140000, "messages", "logical messages through pgoutput (heartbeats, backfill watermarks, annotations)"),
    (150000, "merge", "MERGE, which a Postgres sink's destination needs"),
    (160000, "standby_decoding", "logical decoding on a standby (a standby as the source)"),
    (170000, "failover_slots", "failover slots that survive a promotion (source.failover)"),
    (180000, "generated_columns", "generated columns in publications"),
)


@dataclass(frozen=True)
class ServerVersion:
    num: int  # server_version_num, e.g. 170011
    text: str  # server_version, e.g. "17.11"

    @property
    def major(self) -> int:
        return self.num // 10000

    def has(self, feature: str) -> bool:
        for since, name, _ in FEATURES:
            if name == feature:
                return self.num >= since
        raise KeyError(feature)

    def summary(self) -> tuple[str, str]:
        """(level, text) of check's line about the server: an error below 14, else what it enables and lacks."""
        name = f"PostgreSQL {self.text}"
        if self.num < OLDEST_SUPPORTED:
            return "error", (f"{name} is too old: the drain needs logical messages through pgoutput "
                             "(PostgreSQL 14+); upgrade the server")
        enables = [what for since, _, what in FEATURES if self.num >= since]
        lacks = [f"{what} ({since // 10000}+)" for since, _, what in FEATURES if self.num < since]
        text = f"{name}: enables {'; '.join(enables)}"
        return "ok", text + (f"; lacks {'; '.join(lacks)}" if lacks else "")
