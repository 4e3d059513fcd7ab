"""The messages the pgoutput decoder (pgoutput.py) returns: immutable, and the cheapest records CPython
can build (``NamedTuple`` subclasses). Pure data: no I/O.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, NamedTuple, TypeAlias


class PgOutputError(ValueError):
    """A buffer is not a well-formed pgoutput (protocol v1) message."""


class _UnchangedToast:
    """Type of the ``UNCHANGED_TOAST`` singleton (tuple column kind ``'u'``).

    PostgreSQL sends this for a TOASTed column an UPDATE did not modify: the value is unknown to the
    decoder, not NULL, so it must never be confused with ``None``.
    """

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        # Pickle/copy by global name so the singleton survives pickling (e.g. into Spark workers).
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()

# Each element: None (SQL NULL), UNCHANGED_TOAST, or the raw bytes of the value.
TupleData: TypeAlias = tuple[object, ...]


class Begin(NamedTuple):
    final_lsn: int
    commit_ts: datetime
    xid: int


class Commit(NamedTuple):
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: datetime


class Origin(NamedTuple):
    origin_lsn: int
    name: str


class Column(NamedTuple):
    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


class Relation(NamedTuple):
    relation_id: int
    namespace: str
    name: str
    replica_identity: str  # relreplident: 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]


class TypeMsg(NamedTuple):
    type_oid: int
    namespace: str
    name: str


class Insert(NamedTuple):
    relation_id: int
    new: TupleData


class Update(NamedTuple):
    relation_id: int
    old_kind: str | None  # 'K' (replica identity key columns only), 'O' (full old row) or None
    old: TupleData | None
    new: TupleData


class Delete(NamedTuple):
    relation_id: int
    old_kind: str  # 'K' or 'O'
    old: TupleData


class Truncate(NamedTuple):
    options: int
    relation_ids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.options & 1)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & 2)


class LogicalMessage(NamedTuple):
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message: TypeAlias = (
    Begin | Commit | Origin | Relation | TypeMsg | Insert | Update | Delete | Truncate | LogicalMessage
)
