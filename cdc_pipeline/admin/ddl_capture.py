"""Schema changes at their position in the stream: the source's event trigger (installed by `setup`).

On ``ddl_command_end`` of ALTER TABLE / CREATE TABLE, for each published table a statement touched (a
partition's parent included), the trigger compares the table's shape (``ddl_shape``: columns by attnum with
type, NOT NULL, default, the value existing rows hold for an added column; partitions) with the one it
recorded last, and when it differs emits a transactional logical message (prefix ``DDL_PREFIX``) with both:
the drain reads it at the statement's position, inside its transaction. Anyone may emit a logical message
under any prefix, so each carries an HMAC-SHA256 of its body under a key only the trigger's owner can read
(``ddl_capture``; the drain reads it too): a message without a valid one changes nothing.

Creating an event trigger takes a superuser. Without one the drain compares each RELATION message with the
shape it knew (`catalog` mode: no renames, no defaults of existing rows; `check` says so).
"""

from __future__ import annotations

import secrets
from typing import Literal

import psycopg
from psycopg import sql

from cdc_pipeline.capture.prefixes import DDL_PREFIX
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.findings import Finding

Mode = Literal["trigger", "catalog"]

_OBJECTS = r"""
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.ddl_capture (publication text PRIMARY KEY, k_ipad bytea NOT NULL,
                                            k_opad bytea NOT NULL);
REVOKE ALL ON {s}.ddl_capture FROM PUBLIC;
CREATE TABLE IF NOT EXISTS {s}.ddl_shapes (relid oid PRIMARY KEY, shape jsonb NOT NULL);
REVOKE ALL ON {s}.ddl_shapes FROM PUBLIC;

CREATE OR REPLACE FUNCTION {s}.ddl_shape(rel oid) RETURNS jsonb LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $f$
SELECT jsonb_build_object(
  'table', format('%s.%s', n.nspname, c.relname),
  'columns', coalesce((
    SELECT jsonb_agg(jsonb_build_object(
      'attnum', a.attnum, 'name', a.attname, 'type', format_type(a.atttypid, a.atttypmod),
      'type_oid', a.atttypid, 'not_null', a.attnotnull, 'default', pg_get_expr(d.adbin, d.adrelid),
      'generated', a.attgenerated,
      -- what rows that existed before an ADD COLUMN hold; a partitioned table keeps it in its leaves
      'missing', coalesce(CASE WHEN a.atthasmissing THEN array_to_json(a.attmissingval) ->> 0 END,
        (SELECT array_to_json(l.attmissingval) ->> 0 FROM pg_partition_tree(c.oid) t
         JOIN pg_attribute l ON l.attrelid = t.relid AND l.attname = a.attname
         WHERE c.relkind = 'p' AND t.isleaf AND l.atthasmissing LIMIT 1))
    ) ORDER BY a.attnum)
    FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '[]'),
  'partitions', coalesce((
    SELECT jsonb_agg(format('%s.%s', pn.nspname, pc.relname) ORDER BY pn.nspname, pc.relname)
    FROM pg_partition_tree(c.oid) t JOIN pg_class pc ON pc.oid = t.relid
    JOIN pg_namespace pn ON pn.oid = pc.relnamespace WHERE t.relid <> c.oid), '[]'))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = rel AND c.relkind IN ('r', 'p')
$f$;

CREATE OR REPLACE FUNCTION {s}.ddl_end() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
  target oid; cap record; before jsonb; after jsonb; body text; filled jsonb; leaf record;
BEGIN
  FOR target IN
    SELECT DISTINCT r.relid FROM pg_event_trigger_ddl_commands() e,
      LATERAL (SELECT e.objid AS relid UNION SELECT a.relid FROM pg_partition_ancestors(e.objid) a) r
    WHERE e.classid = 'pg_class'::regclass
  LOOP
    CONTINUE WHEN NOT EXISTS (
      SELECT 1 FROM {s}.ddl_capture k JOIN pg_publication p ON p.pubname = k.publication
      WHERE p.puballtables OR EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = p.oid
        AND (pr.prrelid = target OR pr.prrelid IN (SELECT a.relid FROM pg_partition_ancestors(target) a))));
    after := {s}.ddl_shape(target);
    CONTINUE WHEN after IS NULL;
    SELECT shape INTO before FROM {s}.ddl_shapes WHERE relid = target;
    CONTINUE WHEN before IS NOT DISTINCT FROM after;
    INSERT INTO {s}.ddl_shapes VALUES (target, after) ON CONFLICT (relid) DO UPDATE SET shape = excluded.shape;
    filled := '[]';  -- partitions new to the table that hold rows: PostgreSQL decodes none of them
    FOR leaf IN SELECT t.relid, format('%s.%s', n.nspname, c.relname) AS name FROM pg_partition_tree(target) t
        JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE t.isleaf AND t.relid <> target
          AND NOT coalesce(before -> 'partitions', '[]') ? format('%s.%s', n.nspname, c.relname) LOOP
      IF EXISTS (SELECT 1 FROM pg_class WHERE oid = leaf.relid AND reltuples <> 0) THEN
        EXECUTE format('SELECT CASE WHEN EXISTS (SELECT 1 FROM %s) THEN %L::jsonb END', leaf.relid::regclass,
                       to_jsonb(leaf.name)) INTO body;
        filled := filled || coalesce(body::jsonb, '[]');
      END IF;
    END LOOP;
    FOR cap IN SELECT k.* FROM {s}.ddl_capture k LOOP
      body := jsonb_build_object('v', 1, 'publication', cap.publication, 'relid', target::bigint, 'tag', tg_tag,
        'before', before, 'after', after, 'filled', filled,
        'using', coalesce(current_query() ~* '\musing\M', false))::text;
      PERFORM pg_logical_emit_message(true, '{prefix}',
        encode(sha256(cap.k_opad || sha256(cap.k_ipad || convert_to(body, 'UTF8'))), 'hex') || body);
    END LOOP;
  END LOOP;
END
$f$;
REVOKE ALL ON FUNCTION {s}.ddl_end() FROM PUBLIC;
"""


def trigger_name(schema: str) -> str:
    return f"{schema}_ddl"[:63]


def may_install(conn: psycopg.Connection) -> bool:
    """Creating an event trigger takes a superuser."""
    row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


def installed(conn: psycopg.Connection, schema: str) -> bool:
    row = conn.execute("SELECT evtenabled <> 'D' FROM pg_event_trigger WHERE evtname = %s",
                       (trigger_name(schema),)).fetchone()
    return bool(row and row[0])


def install(conn: psycopg.Connection, config: PipelineConfig) -> list[str]:
    """Create (or refresh) the trigger's objects, a key for this publication and the trigger; record the
    configured tables' shapes. Idempotent. Returns what it did (nothing when it may not)."""
    schema = config.state.schema_name
    if not may_install(conn):
        return []
    was = installed(conn, schema)
    s = sql.Identifier(schema)
    with conn.transaction():
        conn.execute(sql.SQL(_OBJECTS.replace("{prefix}", DDL_PREFIX)).format(s=s))
        key = secrets.token_bytes(32).ljust(64, b"\0")
        conn.execute(sql.SQL("INSERT INTO {}.ddl_capture VALUES (%s, %s, %s) ON CONFLICT DO NOTHING").format(s),
                     (config.source.publication, bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)))
        if not was:
            conn.execute(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(trigger_name(schema))))
            conn.execute(sql.SQL("CREATE EVENT TRIGGER {} ON ddl_command_end WHEN TAG IN ('ALTER TABLE', "
                                 "'CREATE TABLE') EXECUTE FUNCTION {}.ddl_end()").format(
                sql.Identifier(trigger_name(schema)), s))
        for t in config.tables:
            conn.execute(sql.SQL(
                "INSERT INTO {s}.ddl_shapes SELECT c.oid, {s}.ddl_shape(c.oid) FROM pg_class c WHERE c.oid = "
                "to_regclass(format('%%I.%%I', %s::text, %s::text)) ON CONFLICT (relid) DO NOTHING").format(s=s),
                (t.schema_name, t.table_name))
    return [] if was else [f"created event trigger {trigger_name(schema)} (schema changes at their position)"]


def load_key(conn: psycopg.Connection, config: PipelineConfig) -> bytes | None:
    """The HMAC key of this publication's DDL messages; None when the trigger is not installed or the role
    may not read it (the drain then compares RELATION messages instead)."""
    if not installed(conn, config.state.schema_name):
        return None
    try:
        with conn.transaction():
            row = conn.execute(sql.SQL("SELECT k_ipad FROM {}.ddl_capture WHERE publication = %s").format(
                sql.Identifier(config.state.schema_name)), (config.source.publication,)).fetchone()
    except psycopg.Error:
        return None
    return bytes(b ^ 0x36 for b in bytes(row[0])) if row else None


def mode(conn: psycopg.Connection, config: PipelineConfig) -> Mode:
    return "trigger" if load_key(conn, config) is not None else "catalog"


def findings(conn: psycopg.Connection, config: PipelineConfig) -> list[Finding]:
    """Which way schema changes are followed, and what the other way cannot see."""
    if not config.tables:
        return []
    if load_key(conn, config) is not None:
        return [Finding("ok", "schema changes", "followed at their position in the stream (event trigger "
                        f"{trigger_name(config.state.schema_name)}): renames, defaults of existing rows, types")]
    if may_install(conn):
        return [Finding("todo", "schema changes", f"event trigger {trigger_name(config.state.schema_name)} is not "
                        "installed yet: `cdc-pipeline setup` installs it")]
    return [Finding("warning", "schema changes", "catalog mode: the role may not create an event trigger (a "
                    "superuser may), so schema changes are seen by comparing each RELATION message with the "
                    "columns known before. It cannot see a rename (a renamed column, or an added one whose "
                    "existing rows hold a default, is read again by a backfill of the table) nor a USING clause "
                    "(a type change is applied as a cast), nor a partition ATTACHed with rows (PostgreSQL decodes "
                    "none of them: run `cdc-pipeline backfill <parent>` after attaching one). Fix: have a superuser "
                    "run `cdc-pipeline setup`")]
