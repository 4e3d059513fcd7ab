"""Partitioned tables in `check` and `setup`: a partitioned table is captured by its parent's name, which
needs a publication that publishes its partitions' changes as the root's (`publish_via_partition_root`);
a partition configured beside its parent would be delivered twice."""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.findings import Finding
from cdc_pipeline.postgres import partitions


def partitioned_tables(conn: psycopg.Connection, config: PipelineConfig) -> list[str]:
    return [t.qualified for t in config.tables if partitions.is_partitioned(conn, t.schema_name, t.table_name)]


def findings(conn: psycopg.Connection, config: PipelineConfig) -> list[Finding]:
    """A partition configured beside one of its ancestors (an error), and an existing publication that does
    not publish via the root while a configured table is partitioned (a todo: `setup` sets it)."""
    out: list[Finding] = []
    configured = {t.qualified for t in config.tables}
    for t in config.tables:
        above = [a for a in partitions.table_ancestors(conn, t.schema_name, t.table_name) if a in configured]
        if above:
            out.append(Finding("error", t.qualified, f"is a partition of {above[0]}, which is configured too: its "
                               "changes would be delivered twice (once under each name): remove "
                               f"{t.qualified} from `tables` (the parent's changes include its partitions')"))
    parents = partitioned_tables(conn, config)
    pub = config.source.publication
    if parents and partitions.via_root(conn, pub) is False:
        out.append(Finding("todo", "publication", f"{pub!r} publishes partitions' changes under their own names "
                           f"(publish_via_partition_root is off) while {', '.join(parents)} is partitioned: "
                           f"`cdc-pipeline setup` runs ALTER PUBLICATION {pub} SET (publish_via_partition_root = "
                           "true), after which they arrive under the parent's name"))
    return out


# The publication setup creates: a partition's change arrives under its root's name (harmless for others).
CREATE_OPTION = sql.SQL("publish_via_partition_root = true")


def bring_to_root(conn: psycopg.Connection, config: PipelineConfig) -> list[str]:
    """Set publish_via_partition_root on an existing publication when a configured table is partitioned."""
    pub = config.source.publication
    parents = partitioned_tables(conn, config)
    if not parents or partitions.via_root(conn, pub) is not False:
        return []
    conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(sql.Identifier(pub)))
    return [f"set publish_via_partition_root on publication {pub} (partitioned: {', '.join(parents)})"]
