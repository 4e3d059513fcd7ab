"""A pgoutput Relation message -> the drain's RelationShape, with the key its changes are logged by.

The key a change is logged by must be the one the table had *when the change was made*, which is not
always today's catalog (the drain may lag behind a DROP TABLE or a new primary key). Under REPLICA
IDENTITY DEFAULT the stream's own key flags are that key (pgoutput describes the relation from the
catalog as it was at the change); under FULL or USING INDEX they are not, so today's primary key is
used when the relation still has its columns, else the key recorded in the state schema.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg

from cdc_pipeline.capture.changes import RelationShape
from cdc_pipeline.postgres import catalog, partitions, pgoutput
from cdc_pipeline.state.relations import (
    column_record,
    generated_records,
    recorded_primary_key,
    upsert_relation,
)

log = logging.getLogger(__name__)


def choose_key(rel: pgoutput.Relation, today: tuple[str, ...], recorded: tuple[str, ...]) -> tuple[str, ...]:
    """The primary key to log ``rel``'s changes by (see the module docstring); () when none is known."""
    names = [c.name for c in rel.columns]
    flagged = [c.name for c in rel.columns if c.flags & 1]
    if rel.replica_identity == "d" and flagged:
        # The flags are the key at the change's time; take a known key's column order if it matches.
        return next((k for k in (today, recorded) if k and set(k) == set(flagged)), tuple(flagged))
    return next((k for k in (today, recorded) if k and all(c in names for c in k)), ())


def as_configured(rel: pgoutput.Relation, source: psycopg.Connection, configured: frozenset[str],
                  recorded_name: Callable[[int], str | None] | None = None) -> pgoutput.Relation:
    """A partition's relation under the name of its configured ancestor: a publication without
    publish_via_partition_root (or changes decoded before `setup` set it) names the leaf partitions. A
    configured table renamed at the source (``recorded_name``: the name recorded for its relation id) keeps
    its configured name, so its changes are never dropped unseen (`status` reports the rename)."""
    if not configured or f"{rel.namespace}.{rel.name}" in configured:
        return rel
    found = next((a for a in partitions.ancestors(source, rel.relation_id) if a in configured), None)
    if found is None and recorded_name is not None:
        found = recorded_name(rel.relation_id)
        if found is not None and found in configured:
            log.warning("%s.%s is configured table %s renamed: logged as %s until cdc.yaml names it",
                        rel.namespace, rel.name, found, found)
    if found is None or found not in configured:
        return rel
    namespace, _, name = found.partition(".")
    return rel._replace(namespace=namespace, name=name)


def learn_relation(rel: pgoutput.Relation, source: psycopg.Connection, state: psycopg.Connection,
                   schema: str, publication: str, write: bool = True) -> RelationShape:
    """Describe the relation, record it in the state schema's `relations` table (unless ``write`` is
    False: a Relation inside a transaction the log already holds), and return its shape."""
    info = catalog.describe_table(source, rel.namespace, rel.name)
    recorded = recorded_primary_key(state, schema, rel.namespace, rel.name)
    key = choose_key(rel, info.primary_key if info else (), recorded)
    flagged = {c.name for c in rel.columns if c.flags & 1}
    if key and rel.replica_identity != "f" and not set(key) <= flagged:
        log.warning("%s.%s: REPLICA IDENTITY %s does not include the primary key (%s): its deletes (and updates "
                    "of the key) carry no key and cannot be applied by key; `cdc-pipeline check` refuses it: "
                    "ALTER TABLE %s.%s REPLICA IDENTITY DEFAULT (or FULL)", rel.namespace, rel.name,
                    {"i": "USING INDEX", "n": "NOTHING"}.get(rel.replica_identity, rel.replica_identity),
                    ", ".join(key), rel.namespace, rel.name)
    types = catalog.load_types(source, {c.type_oid for c in rel.columns})
    if write:
        # The types as the stream describes them (a lagging drain must not take today's catalog's).
        type_sql = dict(zip([c.name for c in rel.columns], catalog.format_types(
            source, [(c.type_oid, c.type_modifier) for c in rel.columns]), strict=True))
        columns = [column_record(c.name, c.type_oid, type_sql.get(c.name), bool(c.flags & 1), types)
                   for c in rel.columns]
        # Generated columns the stream does not carry (before PostgreSQL 18, or without
        # publish_generated_columns): recorded for a mirror to compute them as the source does.
        columns += generated_records(catalog.streamed_generated(source, publication, rel.namespace, rel.name)[1])
        upsert_relation(state, schema, rel.namespace, rel.name, rel.relation_id, rel.replica_identity, columns, key)
    return RelationShape.from_relation(rel, key or None, types)

