"""The drain's writes to the state database: change-log rows by COPY, relations, slot progress.

All of it happens in the drain's one open state transaction; :meth:`LogWriter.commit` commits the rows
together with the slot progress row, so the log and its recorded position never disagree.
"""

from __future__ import annotations

import logging

import psycopg

from cdc_pipeline.capture import source_server
from cdc_pipeline.capture.changes import LOG_COLUMNS, LogRow
from cdc_pipeline.state import notify, slot_progress

log = logging.getLogger("cdc_pipeline.capture.drain")


class LogWriter:
    def __init__(self, schema: str, slot: str, chunk_rows: int, chunk_bytes: int) -> None:
        self.schema = schema
        self.slot = slot
        self.chunk_rows = chunk_rows
        self.chunk_bytes = chunk_bytes
        self.rows: list[LogRow] = []
        self.bytes = 0
        self.copies = 0
        self._copy_sql = slot_progress.copy_into_log(schema, LOG_COLUMNS)
        # The server this session reads, recorded with its first commit (the progress row exists then).
        self.server: source_server.SourceServer | None = None
        self.unrecorded = False
        self.failovers: list[str] = []  # seen by this process (capture/source_server.py)

    def add(self, row: LogRow, state: psycopg.Connection) -> None:
        """Buffer a row; write the buffer once it holds ``chunk_rows`` rows or ``chunk_bytes`` bytes, so a
        transaction of large documents never piles up in memory."""
        self.rows.append(row)
        # record, changes, texts and the transaction's annotation (copied onto each of its rows)
        self.bytes += len(row[7] or "") + len(row[8] or "") + len(row[11] or "") + len(row[12] or "")
        if len(self.rows) >= self.chunk_rows or self.bytes >= self.chunk_bytes:
            self.flush(state)

    def flush(self, state: psycopg.Connection) -> None:
        if not self.rows:
            return
        with state.cursor() as cur, cur.copy(self._copy_sql) as copy:
            for row in self.rows:
                copy.write_row(row)
        self.copies += 1
        self.discard()

    def discard(self) -> None:
        self.rows.clear()
        self.bytes = 0

    def commit(self, state: psycopg.Connection, end_lsn: int, ts: object) -> None:
        self.flush(state)
        self.save_progress(state, end_lsn, ts)
        notify.announce(state, self.schema)  # deliverers wake when this commits (state/notify.py)
        state.commit()
        if self.unrecorded and self.server is not None:
            self.unrecorded = False
            event = source_server.record(state, self.schema, self.slot, self.server)
            if event:
                log.warning("drain: %s", event)
                self.failovers.append(event)

    def save_progress(self, state: psycopg.Connection, end_lsn: int, ts: object) -> None:
        slot_progress.save(state, self.schema, self.slot, end_lsn, ts)

    def load_progress(self, state: psycopg.Connection, source: psycopg.Connection | None = None) -> int | None:
        """The recorded progress, or None when this slot never committed anything to this log. With the
        session's `source`, its server is identified, to be recorded with the session's first commit."""
        if source is not None:
            self.server, self.unrecorded = source_server.identify(source), True
        recorded = slot_progress.load(state, self.schema, self.slot)
        state.commit()
        return recorded
