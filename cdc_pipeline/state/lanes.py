"""The `sink_lanes` table: a sink's current split over lanes (core/lanes.py), and changing it.

A change of split is made by one process holding every lane lock of the old split (so no old lane sends
meanwhile), in one transaction: the old lanes' offsets become a layer of `prior`, every new lane starts at the
lowest of them, parked messages move to the lane of their group, the old lanes' counts are kept on lane 0,
and the generation (which names what a destination recorded of a lane's position) moves on. The new split
uses the current lane hash (core/lanes.py); each kept layer of `prior` its own (`prior_hashing`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg
from psycopg import sql

from cdc_pipeline.core.lanes import Split, resplit
from cdc_pipeline.core.positions import Position
from cdc_pipeline.state.base import SchemaStore

_COUNTS = ("delivered", "filtered", "parked", "discarded")


class SinkLanes(SchemaStore):
    def split(self, conn: psycopg.Connection, sink: str) -> tuple[Split, int, int | None]:
        """The sink's split, its generation, and a split another process asked for (None: none)."""
        row = conn.execute(sql.SQL("SELECT lanes, prior, generation, wanted, hashing, prior_hashing "
                                   "FROM {}.sink_lanes WHERE sink = %s").format(self.s), (sink,)).fetchone()
        if row is None:
            return Split(), 0, None
        prior = tuple(tuple((int(p[0]), int(p[1])) for p in layer) for layer in row[1])
        return Split(int(row[0]), prior, int(row[4]), tuple(int(h) for h in row[5])), int(row[2]), row[3]

    def want(self, conn: psycopg.Connection, sink: str, lanes: int | None) -> None:
        """Ask the running lanes of another split to stop, so that the split can change to ``lanes`` (None:
        withdraw the request)."""
        conn.execute(sql.SQL(
            "INSERT INTO {}.sink_lanes (sink, lanes, wanted) VALUES (%s, 1, %s) "
            "ON CONFLICT (sink) DO UPDATE SET wanted = excluded.wanted").format(self.s), (sink, lanes))

    def change(self, conn: psycopg.Connection, sink: str, old: Split, generation: int,
               old_offsets: Sequence[Position], lanes: int) -> Split:
        """Change the split (the caller holds every old lane's lock; not committed). ``old_offsets``: where each
        old lane stands, the destination's own record of it included."""
        new, start = resplit(old, old_offsets, lanes)
        s = self.s
        totals = conn.execute(sql.SQL(
            "SELECT " + ", ".join(f"coalesce(sum({c}), 0)" for c in _COUNTS) + " FROM {}.sink_offsets WHERE sink = %s"
        ).format(s), (sink,)).fetchone()
        assert totals is not None
        conn.execute(sql.SQL("DELETE FROM {}.sink_offsets WHERE sink = %s").format(s), (sink,))
        conn.cursor().executemany(sql.SQL(
            "INSERT INTO {}.sink_offsets (sink, lane, commit_lsn, commit_idx) VALUES (%s, %s, %s, %s)").format(s),
            [(sink, lane, *start) for lane in range(lanes)])
        conn.execute(sql.SQL(
            "UPDATE {}.sink_offsets SET " + ", ".join(f"{c} = %s" for c in _COUNTS) + " WHERE sink = %s AND lane = 0"
        ).format(s), (*totals, sink))
        groups = [r[0] for r in conn.execute(sql.SQL(
            "SELECT DISTINCT group_key FROM {}.failed_messages WHERE sink = %s AND group_key IS NOT NULL").format(s),
            (sink,)).fetchall()]
        conn.execute(sql.SQL("UPDATE {}.failed_messages SET lane = 0 WHERE sink = %s AND group_key IS NULL").format(s),
                     (sink,))
        if groups:  # an ungrouped message is parked under its own "~position" group (lanes.parking_group)
            conn.execute(sql.SQL(
                "UPDATE {}.failed_messages f SET lane = m.lane FROM unnest(%s::text[], %s::int[]) AS m(g, lane) "
                "WHERE f.sink = %s AND f.group_key = m.g").format(s),
                (groups, [new.lane_of(g) for g in groups], sink))
        conn.execute(sql.SQL(
            "INSERT INTO {}.sink_lanes (sink, lanes, prior, generation, wanted, hashing, prior_hashing) "
            "VALUES (%s, %s, %s, %s, NULL, %s, %s) ON CONFLICT (sink) DO UPDATE SET lanes = excluded.lanes, "
            "prior = excluded.prior, generation = excluded.generation, wanted = NULL, hashing = excluded.hashing, "
            "prior_hashing = excluded.prior_hashing, changed_at = now()").format(s),
            (sink, lanes, json.dumps([[list(p) for p in layer] for layer in new.prior]), generation + 1,
             new.hashing, json.dumps(list(new.prior_hashing))))
        return new
