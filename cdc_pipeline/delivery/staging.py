"""The Spark (or Arrow) stage of a batch, and isolating the rows a transform fails on by bisection, so only
those are parked, not the batch: the Deliverer's stager."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import psycopg
import pyarrow as pa

from cdc_pipeline.config import SinkConfig
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery import rows
from cdc_pipeline.delivery.arrow_stage import run_arrow_stage
from cdc_pipeline.delivery.enrichment import Enricher
from cdc_pipeline.delivery.lazy_spark import LazySpark
from cdc_pipeline.delivery.plan import SinkPlan, empty_output
from cdc_pipeline.delivery.source_tables import SourceTables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("cdc_pipeline.delivery.engine")

# (position, group, error) of a message the Spark stage could not process.
StageFailure = tuple[Position, str | None, str]
# Spark jobs one batch may spend isolating failing rows: ~2*log2(batch) per poison row. Past it, the
# rows not yet isolated are parked together (not counted against their retries) instead of failing the run.
MAX_STAGE_SPLITS = 128


class NotIsolated(str):
    """A transform error of a row that was parked with others before the bisection isolated it."""

    __slots__ = ()


Schemas = dict[str, list[dict[str, object]]]  # the relations' columns, for a stage that builds records


class Stager:
    """One sink's stage: enrichment, row-stream coalescing, then Arrow or Spark, bisecting runtime failures."""

    def __init__(self, spark: SparkSession | LazySpark, plan: SinkPlan, sink_config: SinkConfig, tables: SourceTables,
                 enricher: Enricher | None) -> None:
        self.spark = spark
        self.plan = plan
        self.sink_config = sink_config
        self.tables = tables  # the relations' columns (records) and primary keys (row streams' deletes)
        self.enricher = enricher  # the sink's enrichment query (enrichment.py)

    def schemas(self, conn: psycopg.Connection) -> Schemas:
        """What `stage` needs of the relations: their columns when Spark builds records, else nothing."""
        return self.tables.columns(conn) if self.plan.needs_record else {}

    def stage(self, batch: pa.Table, schemas: Schemas) -> tuple[pa.Table, list[StageFailure]]:
        if self.enricher is not None and batch.num_rows:  # every path: live, parked retries, replays
            batch = self.enricher.enrich(batch)
        if self.sink_config.stream != "rows":
            return self._stage_changes(batch, schemas)
        batch = rows.coalesce(batch, self.sink_config.deletes)  # rows.py: row streams, any sink type
        out, failed = self._stage_changes(batch, schemas)
        return rows.reshape(out, rows.deleted_keys(batch, self.tables.primary_key)), failed

    def _stage_changes(self, batch: pa.Table, schemas: Schemas
                       ) -> tuple[pa.Table, list[StageFailure]]:
        """Run the Spark stage; when it fails at run time (a transform raising on some row), bisect the
        batch to find the rows that make it fail, so only those are parked, not the batch."""
        if not self.plan.needs_record:
            return run_arrow_stage(self.plan, batch), []  # nothing for Spark to compute (arrow_stage.py)
        budget = [MAX_STAGE_SPLITS]
        return self._stage_bisect(batch, schemas, budget)

    def _stage_bisect(self, batch: pa.Table, schemas: Schemas, budget: list[int]
                      ) -> tuple[pa.Table, list[StageFailure]]:
        from pyspark.errors import AnalysisException, ParseException  # a sink with Spark work only (plan.py)

        from cdc_pipeline.delivery.spark_stage import run_stage

        try:
            return run_stage(self.spark, self.plan, batch, schemas), []
        except (AnalysisException, ParseException):
            raise  # a bad expression fails every row (unknown column...): a config problem, not a poison message
        except Exception as exc:
            budget[0] -= 1
            cause = f"{type(exc).__name__}: {_cause(exc)}"
            if batch.num_rows == 1:
                error = f"transform failed: {cause}"
            elif budget[0] < 0:  # park what is left rather than fail the run (and every run after it)
                error = NotIsolated(f"transform failed on this row or another of the {batch.num_rows} parked "
                                    f"with it (bisection budget spent): {cause}")
            else:
                mid = batch.num_rows // 2
                left, lf = self._stage_bisect(batch.slice(0, mid), schemas, budget)
                right, rf = self._stage_bisect(batch.slice(mid), schemas, budget)
                return pa.concat_tables([left.cast(right.schema), right]), lf + rf
            groups = self._groups(batch, schemas)
            return empty_output(), [(pos, groups[pos], error) for pos in groups]

    def _groups(self, batch: pa.Table, schemas: Schemas
                ) -> dict[Position, str | None]:
        """Each row's ordering group: its `group_columns` group where the table has one (via Spark, as
        the stage computes it), else table and key."""
        rows = [(int(r["commit_lsn"]), int(r["commit_idx"]), f"{r['table_schema']}|{r['table_name']}|{r['pk']}")
                for r in batch.select(["commit_lsn", "commit_idx", "table_schema", "table_name", "pk"]).to_pylist()]
        if not self.sink_config.message_grouping:
            return {(lsn, idx): None for lsn, idx, _ in rows}
        found: dict[Position, str | None] = {}
        if self.plan.group_columns:
            from cdc_pipeline.delivery.spark_stage import group_keys

            try:
                found = group_keys(self.spark, self.plan, batch, schemas)
            except Exception as exc:  # the record itself breaks Spark: table and key still order it
                log.warning("deliver: sink %s: cannot compute groups of failed rows: %s", self.sink_config.name,
                            _cause(exc))
        return {(lsn, idx): found.get((lsn, idx), default) for lsn, idx, default in rows}


def _cause(exc: BaseException) -> str:
    """The informative line of a Spark error: for a Python worker failure the traceback's last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    tb = [line for line in lines if not line.startswith(("File ", "^", "~"))]
    line = tb[-1] if "Traceback" in str(exc) and tb else lines[0]
    return line[:400]

