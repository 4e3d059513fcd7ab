"""Backfill watermarks and page snapshots (pure: values in, values out).

Each page is bracketed by two transactional logical messages with prefix ``WATERMARK_PREFIX``: the low
one before the page's snapshot is taken, the high one after its rows are staged. The high one also
carries an xid assigned after the snapshot, which bounds the transactions the snapshot may have missed
(see :meth:`Snapshot.unseen`).

pgoutput reports 32-bit xids; ``pg_current_snapshot()`` gives 64-bit ``xid8`` values (epoch << 32 |
xid). A page's candidates are a narrow 64-bit range, so they map onto 32-bit values exactly, with the
range split in two where it crosses a wraparound.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

WATERMARK_PREFIX = "cdc_pipeline.watermark"
XID32 = 1 << 32

Kind = Literal["low", "high"]


@dataclass(frozen=True, slots=True)
class Watermark:
    backfill_id: str
    page: int
    kind: Kind
    # high only: an xid8 assigned after the page's snapshot was taken
    xid: int | None = None
    # high only: which staging of the page it seals (page_token), so a high watermark whose staging was
    # lost (a state database restored, or crashed with synchronous_commit off) never seals a re-read
    token: str | None = None

    def body(self) -> dict[str, object]:
        body: dict[str, object] = {"id": self.backfill_id, "page": self.page, "kind": self.kind}
        if self.xid is not None:
            body["xid"] = str(self.xid)
        if self.token is not None:
            body["token"] = self.token
        return body

    def encode(self, key: str) -> str:
        """The message content: the fields and an HMAC of them under the backfill's key (see ``decode``)."""
        body = self.body()
        return json.dumps({**body, "mac": mac(key, body)}, separators=(",", ":"))


def mac(key: str, body: dict[str, object]) -> str:
    """HMAC-SHA256 over the canonical JSON of a watermark's fields (every field: id, page, kind, xid, token)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key.encode(), canonical, hashlib.sha256).hexdigest()


# Ours are a few hundred bytes; anything else under the prefix is the application's and is never parsed at
# length. Fields are checked for the shape ours have before any reaches a query (a backfill id is bf_ + hex).
MAX_BYTES = 4096
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TOKEN = re.compile(r"[0-9a-f]{1,64}")
_PAGE_MAX = 2**31 - 1
_XID8_MAX = 2**64 - 1


def _field(body: dict[str, object], name: str, pattern: re.Pattern[str]) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise ValueError(name)
    return value


def _bounded(value: object, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or len(str(value)) > 20:
        raise ValueError("not a bounded integer")
    number = int(value)
    if not 0 <= number <= top:
        raise ValueError("out of range")
    return number


def decode(content: bytes | str) -> Watermark | None:
    """The watermark in a logical message's content, or None if it is not one of ours (any content: this is
    the application's input, so nothing here raises). Not yet authenticated: check it with ``verify`` and
    the backfill's key."""
    if len(content) > MAX_BYTES:
        return None
    try:
        body = json.loads(content)
        if not isinstance(body, dict) or body.get("kind") not in ("low", "high"):
            return None
        backfill_id = _field(body, "id", _ID)
        if backfill_id is None:
            return None
        xid = body.get("xid")
        return Watermark(backfill_id, _bounded(body.get("page"), _PAGE_MAX), body["kind"],
                         _bounded(xid, _XID8_MAX) if xid is not None else None, _field(body, "token", _TOKEN))
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def verify(content: bytes | str, mark: Watermark, key: str) -> bool:
    """Whether ``content`` carries a valid HMAC of exactly ``mark``'s fields under ``key``."""
    try:
        given = json.loads(content).get("mac")
    except (ValueError, AttributeError, RecursionError):
        return False
    return isinstance(given, str) and hmac.compare_digest(given, mac(key, mark.body()))


def page_token(snapshot: str, read_at: datetime) -> str:
    """Identifies one staging of a page: its snapshot and the time it was read (as an instant, so the
    session time zone of whoever computes it does not matter)."""
    return hashlib.sha1(f"{snapshot}|{read_at.timestamp():.6f}".encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """``pg_current_snapshot()``: xids below xmin are finished, xids at or above xmax had not finished,
    xip lists those in between that were still running."""

    xmin: int
    xmax: int
    xip: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), tuple(int(x) for x in xip.split(",") if x))

    def __str__(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, self.xip))}"

    def sees(self, xid8: int) -> bool:
        """Whether a transaction that committed is visible to this snapshot."""
        return xid8 < self.xmax and xid8 not in self.xip

    def unseen(self, upper: int) -> tuple[list[int], list[tuple[int, int]]]:
        """The transactions this snapshot could not see among those that began before it, as 32-bit
        xids: (exact xids, half-open ranges [lo, hi)).

        ``upper`` is any xid8 assigned after the snapshot was taken (the high watermark's own), so
        every transaction that had an xid when the snapshot was taken is below it. A transaction
        that committed before the low watermark but after the snapshot looked (the commit record is
        written before the transaction leaves the proc array) is one of these.
        """
        exact = sorted({x % XID32 for x in self.xip})
        if upper <= self.xmax:
            return exact, []
        lo, hi = self.xmax % XID32, upper % XID32
        if upper - self.xmax >= XID32:  # cannot happen for one page; fail safe: every xid
            return exact, [(0, XID32)]
        if lo < hi:
            return exact, [(lo, hi)]
        ranges = [(lo, XID32)]
        if hi > 0:
            ranges.append((0, hi))
        return exact, ranges

