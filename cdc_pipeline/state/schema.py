"""The state database's schema: the change log, offsets, checkpoints and failed messages.

Migrations are an ordered list of SQL steps applied once each, recorded in `schema_version`, under an
advisory lock so two `setup` calls at once cannot race. Positions are (commit_lsn, commit_idx), with
the LSN held as bigint: cheap to compare and to carry through Arrow.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc_pipeline.postgres import catalog

MIGRATIONS: list[str] = [
    # 1: the core
    """
    CREATE TABLE {s}.change_log (
        commit_lsn   bigint      NOT NULL,
        commit_idx   integer     NOT NULL,
        xid          bigint,
        table_schema text        NOT NULL,
        table_name   text        NOT NULL,
        action       text        NOT NULL,
        pk           text,
        record       jsonb,
        changes      jsonb,
        commit_ts    timestamptz NOT NULL,
        backfill_id  text,
        PRIMARY KEY (commit_lsn, commit_idx)
    );
    CREATE TABLE {s}.relations (
        table_schema     text NOT NULL,
        table_name       text NOT NULL,
        relation_id      bigint,
        replica_identity text,
        columns          jsonb NOT NULL,
        primary_key      text[] NOT NULL DEFAULT '{{}}',
        updated_at       timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (table_schema, table_name)
    );
    CREATE TABLE {s}.slot_progress (
        slot               text PRIMARY KEY,
        committed_lsn      bigint NOT NULL DEFAULT 0,
        last_commit_ts     timestamptz,
        last_heartbeat_at  timestamptz,
        updated_at         timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE {s}.sink_offsets (
        sink        text PRIMARY KEY,
        commit_lsn  bigint  NOT NULL DEFAULT 0,
        commit_idx  integer NOT NULL DEFAULT -1,
        delivered   bigint  NOT NULL DEFAULT 0,
        filtered    bigint  NOT NULL DEFAULT 0,
        parked      bigint  NOT NULL DEFAULT 0,
        discarded   bigint  NOT NULL DEFAULT 0,
        last_commit_ts timestamptz,
        updated_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE {s}.failed_messages (
        sink            text        NOT NULL,
        commit_lsn      bigint      NOT NULL,
        commit_idx      integer     NOT NULL,
        group_key       text,
        status          text        NOT NULL DEFAULT 'parked',
        attempts        integer     NOT NULL DEFAULT 0,
        last_error      text,
        first_failed_at timestamptz NOT NULL DEFAULT now(),
        next_attempt_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (sink, commit_lsn, commit_idx)
    );
    CREATE INDEX ON {s}.failed_messages (sink, status, group_key);
    """,
    # 2: backfills (cdc_pipeline/backfill). Pages are staged here before their high watermark; the
    # drain reconciles them at it (capture/reconcile.py), finding changes of transactions a page's
    # snapshot could not see through the xid index.
    """
    CREATE TABLE {s}.backfills (
        id             text PRIMARY KEY,
        identity       text        NOT NULL,
        table_schema   text        NOT NULL,
        table_name     text        NOT NULL,
        sinks          text[]      NOT NULL,
        primary_key    text[]      NOT NULL,
        keyset         text[]      NOT NULL,
        sort_column    text,
        start_value    text,
        end_value      text,
        status         text        NOT NULL DEFAULT 'running',
        origin         text,
        estimated_rows bigint,
        cursor         text[],
        pages          integer     NOT NULL DEFAULT 0,
        rows_read      bigint      NOT NULL DEFAULT 0,
        rows_dropped   bigint      NOT NULL DEFAULT 0,
        checkpoint_at  timestamptz,
        error          text,
        created_at     timestamptz NOT NULL DEFAULT now(),
        updated_at     timestamptz NOT NULL DEFAULT now(),
        finished_at    timestamptz
    );
    CREATE INDEX ON {s}.backfills (table_schema, table_name) WHERE status IN ('running', 'paused');
    CREATE TABLE {s}.backfill_pages (
        backfill_id   text        NOT NULL,
        page_no       integer     NOT NULL,
        snapshot      text        NOT NULL,
        read_at       timestamptz NOT NULL,
        page_size     integer     NOT NULL,
        rows          integer     NOT NULL,
        read_ms       real        NOT NULL,
        cursor        text[],
        last          boolean     NOT NULL,
        status        text        NOT NULL DEFAULT 'staged',
        dropped       integer,
        high_lsn      bigint,
        high_idx      integer,
        staged_at     timestamptz NOT NULL DEFAULT now(),
        reconciled_at timestamptz,
        PRIMARY KEY (backfill_id, page_no)
    );
    CREATE TABLE {s}.backfill_low_watermarks (
        backfill_id text    NOT NULL,
        page_no     integer NOT NULL,
        commit_lsn  bigint  NOT NULL,
        commit_idx  integer NOT NULL,
        PRIMARY KEY (backfill_id, page_no)
    );
    CREATE TABLE {s}.backfill_rows (
        backfill_id text    NOT NULL,
        page_no     integer NOT NULL,
        seq         integer NOT NULL,
        pk          text    NOT NULL,
        record      jsonb   NOT NULL,
        cursor      text
    );
    CREATE INDEX ON {s}.backfill_rows (backfill_id, page_no);
    CREATE TABLE {s}.backfill_readers (
        backfill_id   text PRIMARY KEY,
        page_attempts integer     NOT NULL DEFAULT 0,
        rows_fetched  bigint      NOT NULL DEFAULT 0,
        page_size     integer,
        updated_at    timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX change_log_xid ON {s}.change_log (xid) WHERE xid IS NOT NULL;
    """,
    # 3: pull consumers (state/pull_queue.py). Delivery to an http_pull sink inserts here in the
    # transaction that advances the sink's offset; `serve` hands rows out and deletes them on ack. `id`
    # is insert order, which is commit order (one deliverer per sink); visible_at is when an unacked
    # message is available again (-infinity: never handed out yet). Half-empty pages let a lease be a
    # HOT update (no indexed column changes), so receive writes no index entries; frequent autovacuum
    # keeps acked rows' dead index entries from slowing the group-head check.
    """
    CREATE TABLE {s}.pull_queue (
        consumer    text        NOT NULL,
        id          bigint      GENERATED ALWAYS AS IDENTITY,
        commit_lsn  bigint      NOT NULL,
        commit_idx  integer     NOT NULL,
        group_key   text,
        payload     text        NOT NULL,
        deliveries  integer     NOT NULL DEFAULT 0,
        visible_at  timestamptz NOT NULL DEFAULT '-infinity',
        parked      boolean     NOT NULL DEFAULT false,
        enqueued_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (consumer, id)
    ) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 2000);
    CREATE INDEX pull_queue_group ON {s}.pull_queue (consumer, group_key, id);
    """,
    # 4: how far retention has deleted the log (state/replay_log.py): a replay window must start after it.
    """
    CREATE TABLE {s}.log_trimmed (
        one           boolean PRIMARY KEY DEFAULT true CHECK (one),
        trimmed_until timestamptz NOT NULL
    );
    CREATE INDEX change_log_commit_ts ON {s}.change_log (commit_ts);
    """,
    # 5: a delivery waiting for its destination (or the state database) says so, for `status`.
    # (IF NOT EXISTS: safe whatever order migrations of parallel branches are merged in.)
    """
    ALTER TABLE {s}.sink_offsets ADD COLUMN IF NOT EXISTS waiting_since timestamptz,
        ADD COLUMN IF NOT EXISTS waiting_reason text;
    """,
    # 6: per-backfill key that authenticates its watermarks (backfill/watermark.py): any role that can log in
    # to the source can emit a logical message, only the pipeline can read this. gen_random_uuid draws
    # from the server's strong random source; volatile, so every existing row gets its own key.
    """
    ALTER TABLE {s}.backfills ADD COLUMN mac_key text NOT NULL
        DEFAULT replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    """,
    # 7: typed reads (state/typed_rows.py). A page bound for a Postgres mirror is staged as the row's
    # composite text (`tup`) instead of `to_jsonb` (`record` NULL); the backfill names the composite type
    # (in this schema) that parses it. JSON for other consumers is made from it when they load it.
    """
    ALTER TABLE {s}.backfill_rows ALTER COLUMN record DROP NOT NULL, ADD COLUMN IF NOT EXISTS tup text;
    ALTER TABLE {s}.change_log ADD COLUMN IF NOT EXISTS tup text;
    ALTER TABLE {s}.backfills ADD COLUMN IF NOT EXISTS typed_type text,
        ADD COLUMN IF NOT EXISTS typed_columns jsonb;
    CREATE OR REPLACE FUNCTION {s}.typed_record(backfill text, tup text) RETURNS jsonb
    LANGUAGE plpgsql STABLE STRICT AS $$
    DECLARE
        type_name text;
        result jsonb;
    BEGIN
        SELECT b.typed_type INTO type_name FROM {s}.backfills b WHERE b.id = backfill;
        IF type_name IS NULL THEN
            RAISE EXCEPTION 'typed read of backfill % has no row type', backfill;
        END IF;
        EXECUTE format('SELECT to_jsonb($1::%s)', type_name) INTO result USING tup;
        RETURN result;
    END
    $$;
    """,
    # 8: the source's text of the values whose JSON does not give a mirror the source's value back
    # (postgres/pgtypeinfo.py: TextRule), as a JSON object by column; NULL for most rows.
    """
    ALTER TABLE {s}.change_log ADD COLUMN IF NOT EXISTS texts jsonb;
    ALTER TABLE {s}.backfill_rows ADD COLUMN IF NOT EXISTS texts jsonb;
    """,
    # 9: a transaction's annotation (capture/annotations.py) on each of its changes logged after it; NULL
    # for most rows and for every backfill read.
    """
    ALTER TABLE {s}.change_log ADD COLUMN IF NOT EXISTS annotations jsonb;
    """,
    # 10: lanes (core/lanes.py): a sink's offsets and parked messages per lane, and its current split
    # (how many lanes, the layers of earlier splits' offsets its lanes skip, the generation naming the
    # destinations' own positions, and a split other processes asked for). A sink without lanes is lane 0.
    """
    ALTER TABLE {s}.sink_offsets ADD COLUMN IF NOT EXISTS lane integer NOT NULL DEFAULT 0;
    ALTER TABLE {s}.sink_offsets DROP CONSTRAINT IF EXISTS sink_offsets_pkey;
    ALTER TABLE {s}.sink_offsets ADD PRIMARY KEY (sink, lane);
    ALTER TABLE {s}.failed_messages ADD COLUMN IF NOT EXISTS lane integer NOT NULL DEFAULT 0;
    CREATE INDEX IF NOT EXISTS failed_messages_lane ON {s}.failed_messages (sink, lane, status, group_key);
    CREATE TABLE IF NOT EXISTS {s}.sink_lanes (
        sink        text PRIMARY KEY,
        lanes       integer     NOT NULL,
        prior       jsonb       NOT NULL DEFAULT '[]',
        generation  integer     NOT NULL DEFAULT 0,
        wanted      integer,
        changed_at  timestamptz NOT NULL DEFAULT now()
    );
    """,
    # 11: each table's last schema change as the drain logged it (capture/schema_changes.py): status, metrics
    # and Dagster show it.
    """
    ALTER TABLE {s}.relations ADD COLUMN IF NOT EXISTS last_schema_change jsonb;
    """,
    # 12: which server the drain reads a slot on (capture/source_server.py): its address, version, timeline
    # and system identifier as of the drain's last session, and the failovers seen (a session on another
    # server or timeline than the one before).
    """
    ALTER TABLE {s}.slot_progress ADD COLUMN IF NOT EXISTS source_server jsonb;
    ALTER TABLE {s}.slot_progress ADD COLUMN IF NOT EXISTS failovers integer NOT NULL DEFAULT 0;
    ALTER TABLE {s}.slot_progress ADD COLUMN IF NOT EXISTS last_failover jsonb;
    """,
    # 13: lanes that read only their share (core/lanes.py): a split's lane hash (1 CRC-32, which splits made
    # before this have; 2 MD5, which the log's reads compute in SQL) and each prior layer's; the log rows each
    # lane has read, for `status`. The change log itself is unchanged: its lane is computed as it is read.
    """
    ALTER TABLE {s}.sink_lanes ADD COLUMN IF NOT EXISTS hashing integer NOT NULL DEFAULT 1,
        ADD COLUMN IF NOT EXISTS prior_hashing jsonb NOT NULL DEFAULT '[]';
    ALTER TABLE {s}.sink_offsets ADD COLUMN IF NOT EXISTS rows_read bigint NOT NULL DEFAULT 0;
    """,
    # 14: staged backfill rows are unlogged: staging writes no WAL, so the walsender never decodes it either. A
    # crash of the state database empties the table; a page whose rows are gone is never reconciled (the drain
    # checks) and the backfill reads it again when it runs next (backfill/engine.py).
    """
    ALTER TABLE {s}.backfill_rows SET UNLOGGED;
    """,
    # 15: cheaper appends to the log and to staging (issue 38). Every log row paid a btree entry on commit_ts
    # (about a quarter of a backfill page's insert into the log, and WAL the walsender then reads), though
    # commit times only serve retention and replay windows, which read whole ranges: a BRIN index (positions
    # and commit times grow together) costs nothing per row. A staged page is written and read whole: BRIN
    # there too (a fifth of a page's read-and-stage). The schema-history lookup (sinks/postgres/history.py)
    # scanned every log row after a position: a partial index holds only schema rows.
    """
    DROP INDEX IF EXISTS {s}.change_log_commit_ts;
    CREATE INDEX IF NOT EXISTS change_log_commit_ts_brin ON {s}.change_log USING brin (commit_ts)
        WITH (autosummarize = on);
    CREATE INDEX IF NOT EXISTS change_log_schema_rows ON {s}.change_log (table_schema, table_name, commit_lsn, commit_idx)
        WHERE action = 'schema';
    DROP INDEX IF EXISTS {s}.backfill_rows_backfill_id_page_no_idx;
    CREATE INDEX IF NOT EXISTS backfill_rows_page_brin ON {s}.backfill_rows USING brin (backfill_id, page_no);
    """,
]


def ensure_schema(conn: psycopg.Connection, schema: str) -> int:
    """Create or migrate the state schema; idempotent. Returns the number of migrations applied."""
    s = sql.Identifier(schema)
    with conn.transaction():
        # One setup at a time per database, keyed on the schema name.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"cdc_pipeline.schema:{schema}",))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(s))
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.schema_version "
            "(version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(s))
        row = conn.execute(sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_version").format(s)).fetchone()
        current = int(row[0]) if row else 0
        for version, ddl in enumerate(MIGRATIONS, start=1):
            if version <= current:
                continue
            conn.execute(sql.SQL(ddl).format(s=s))
            conn.execute(sql.SQL("INSERT INTO {}.schema_version (version) VALUES (%s)").format(s), (version,))
        return max(0, len(MIGRATIONS) - current)


def schema_exists(conn: psycopg.Connection, schema: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'change_log'", (schema,)
    ).fetchone()
    return row is not None


def pending_migrations(conn: psycopg.Connection, schema: str) -> int | None:
    """How many migrations `ensure_schema` would apply: None when the schema does not exist yet."""
    if not catalog.table_exists(conn, schema, "schema_version"):
        return None
    found = conn.execute(sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_version")
                         .format(sql.Identifier(schema))).fetchone()
    return max(0, len(MIGRATIONS) - (int(found[0]) if found else 0))
