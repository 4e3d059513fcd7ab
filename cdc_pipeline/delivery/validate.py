"""Check-time validation of each sink's Spark SQL (`filter`, `transform`, `route`) and Python transform.

For every table a sink reads, an empty DataFrame with exactly the columns the Spark stage gives those
expressions (`record`/`changes` structs typed from the SOURCE catalog, `action`, `metadata`, ...) is
built, and each expression is applied to it. Reading `.schema` forces Spark's analysis without running
anything, so a syntax error, an unknown column or a non-boolean filter surfaces here, at `check`, rather
than as a failed delivery run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.findings import Finding
from cdc_pipeline.delivery import plan, spark_stage
from cdc_pipeline.postgres.catalog import ColumnInfo, TableInfo
from cdc_pipeline.state.change_log import LOG_ARROW_SCHEMA

# What run_stage selects from the frame after filter/transform/route (a Python transform must keep them).
_STAGE_COLUMNS = ("commit_lsn", "commit_idx", "group_key", "route")


def needs_spark(sink: SinkConfig) -> bool:
    return bool(sink.filter or sink.transform or sink.route)


def validate_sinks(config: PipelineConfig, tables: Mapping[str, TableInfo],
                   spark_factory: Callable[[], SparkSession] | None = None) -> list[Finding]:
    """Findings for every sink with Spark SQL or a Python transform; `tables` maps 'schema.table' to the
    source's TableInfo (tables missing from it are already reported by `check` and skipped here)."""
    sinks = [s for s in config.sinks if needs_spark(s)]
    if not sinks:
        return []  # no Spark start-up for configs that have nothing to analyze
    try:
        spark = (spark_factory or (lambda: spark_stage.spark_session(config.spark)))()
    except Exception as exc:
        return [Finding("error", "spark", f"cannot start Spark to check sink expressions: {first_line(exc)}")]
    out: list[Finding] = []
    with _quiet_spark_errors():
        for sink in sinks:
            checked = [t for t in sink.tables if t in tables]
            problems: dict[tuple[str, str], list[str]] = {}  # (key, complaint) -> tables it applies to
            for table in checked:
                frame = empty_table_frame(spark, tables[table].columns, sink.name)
                for problem in validate_sink(sink, frame):
                    problems.setdefault(problem, []).append(table)
            out += [Finding("error", f"sinks.{sink.name}.{key}", f"{message} ({_tables(names)})")
                    for (key, message), names in problems.items()]
            if not problems:
                keys = [k for k in ("filter", "transform", "route") if getattr(sink, k)]
                out.append(Finding("ok", f"sinks.{sink.name}",
                                   f"{', '.join(keys)} analyzed against {', '.join(checked)}"))
    return out


def _tables(names: Sequence[str]) -> str:
    return f"table {names[0]}" if len(names) == 1 else f"tables {', '.join(names)}"


def validate_sink(sink: SinkConfig, frame: DataFrame) -> list[tuple[str, str]]:
    """(key, Spark's complaint) for each of `sink`'s expressions that fails on `frame`, an empty stage
    frame of one table (see empty_table_frame)."""
    out: list[tuple[str, str]] = []
    condition, route_expr = sink.filter, sink.route
    if condition:
        problem = _analyze(lambda: frame.where(F.expr(condition)))
        if problem:
            out.append(("filter", problem))
    # The stage adds these before any transform runs; a bad route is reported once, under route.
    route: Column = F.lit(None).cast("string")
    if route_expr:
        problem = _analyze(lambda: frame.select(F.expr(route_expr).cast("string")))
        if problem:
            out.append(("route", problem))
        else:
            route = F.expr(route_expr).cast("string")
    frame = frame.withColumn("group_key", F.lit(None).cast("string")).withColumn("route", route)
    if isinstance(sink.transform, dict):
        for field, expr in sink.transform.items():
            problem = _analyze(lambda e=expr, k=field: frame.select(F.to_json(F.struct(F.expr(e).alias(k)))))
            if problem:
                out.append((f"transform.{field}", problem))
    elif isinstance(sink.transform, str):
        problem = _python_transform(frame, sink.transform)
        if problem:
            out.append(("transform", f"{sink.transform}: {problem}"))
    return out


def empty_table_frame(spark: SparkSession, columns: Sequence[ColumnInfo], sink_name: str) -> DataFrame:
    """An empty batch of one table exactly as run_stage hands it to the filter and transform."""
    df = spark.createDataFrame(LOG_ARROW_SCHEMA.empty_table())
    return spark_stage.table_frame(df, [{"name": c.name, "type_oid": c.type_oid} for c in columns], sink_name)


def _python_transform(frame: DataFrame, ref: str) -> str | None:
    try:
        fn = plan.load_function(ref)
    except Exception as exc:  # ImportError, AttributeError, TypeError: all "cannot be used"
        return f"cannot load: {type(exc).__name__}: {first_line(exc)}"
    try:
        result = fn(frame)
    except Exception as exc:
        return f"raised on an empty batch: {type(exc).__name__}: {first_line(exc)}"
    if not isinstance(result, DataFrame):
        return f"returned {type(result).__name__}, not a DataFrame"
    missing = [c for c in _STAGE_COLUMNS if c not in result.columns]
    if missing:
        return f"its result lacks column(s) {', '.join(missing)}, which delivery needs"
    visible = [c for c in result.columns if c not in plan.HIDDEN_COLUMNS]
    return _analyze(lambda: result.select(*_STAGE_COLUMNS, F.to_json(F.struct(*visible))))


def _analyze(build: Callable[[], DataFrame]) -> str | None:
    try:
        build().schema  # noqa: B018 - resolving the schema runs Spark's analyzer, nothing else
    except Exception as exc:
        return first_line(exc)
    return None


def first_line(exc: BaseException) -> str:
    """Spark's complaint without the plan dump: the first non-empty line, minus its trailing ';'."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip().rstrip(";")
    return type(exc).__name__


@contextlib.contextmanager
def _quiet_spark_errors() -> Iterator[None]:
    # PySpark logs every analysis error with a full JVM stack trace; here they are expected findings.
    from pyspark.logger import PySparkLogger

    loggers = [PySparkLogger.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was
