"""The Spark part of delivery: filter, transform, route and group one micro-batch of the change log.
Imported only when a stage needs Spark (pyspark's import alone costs a third of a second of start-up).

Input is an Arrow table of log rows; output is an Arrow table with one row per message to send:
`commit_lsn, commit_idx, group_key, route, payload, error`. Records stay raw JSON text unless the sink's
filter, transform, route or grouping needs fields from them: then they are parsed with a schema built
from the relation's column types, one table at a time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_pipeline.config import SparkConfig
from cdc_pipeline.delivery.plan import (
    HIDDEN_COLUMNS,
    METADATA_TAIL,
    SinkPlan,
    consumer_id,
    empty_output,
    takes_texts,
    takes_truncate,
)
from cdc_pipeline.postgres.oids import ARRAY_ELEMENT, OID

# A null field stays in the message as null (Spark's to_json drops null fields by default).
_JSON_OPTIONS = {"ignoreNullFields": "false"}

# Types a filter or transform sees typed; every other type is a string (its JSON text for arrays of them).
_SCALAR_TYPES: dict[int, T.DataType] = {
    OID.BOOL: T.BooleanType(), OID.INT8: T.LongType(), OID.INT2: T.IntegerType(), OID.INT4: T.IntegerType(),
    OID.OID: T.LongType(), OID.FLOAT4: T.DoubleType(), OID.FLOAT8: T.DoubleType(), OID.NUMERIC: T.DoubleType(),
    OID.DATE: T.DateType(), OID.TIMESTAMP: T.TimestampNTZType(), OID.TIMESTAMPTZ: T.TimestampType(),
}


def spark_conf(config: SparkConfig) -> dict[str, str]:
    """The one Spark configuration, shared by the CLI's session and the Dagster SparkResource."""
    conf = {
        "spark.master": config.master,
        "spark.app.name": "cdc_pipeline",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "2g",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }
    conf.update(config.conf)
    return conf


def prepare_environment() -> None:
    """Spark's Python workers must run this interpreter (with pyarrow and this package), not whatever
    `python3` is on PATH; read from the environment when the context starts."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_session(config: SparkConfig) -> SparkSession:
    prepare_environment()
    builder = SparkSession.builder
    for key, value in spark_conf(config).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_type(type_oid: int) -> T.DataType:
    if type_oid in ARRAY_ELEMENT:
        return T.ArrayType(spark_type(ARRAY_ELEMENT[type_oid]))
    return _SCALAR_TYPES.get(type_oid, T.StringType())


def record_schema(columns: Sequence[dict[str, object]]) -> T.StructType:
    return T.StructType([T.StructField(str(c["name"]), spark_type(int(c["type_oid"]))) for c in columns])  # type: ignore[call-overload]


def _metadata(sink_name: str) -> Column:
    return F.struct(
        F.col("table_schema").alias("table_schema"),
        F.col("table_name").alias("table_name"),
        F.date_format("commit_ts", "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX").alias("commit_timestamp"),
        F.col("commit_lsn").alias("commit_lsn"),
        F.col("commit_idx").alias("commit_idx"),
        F.concat_ws(":", F.col("commit_lsn").cast("string"), F.col("commit_idx").cast("string")).alias(
            "idempotency_key"),
        F.struct(F.lit(consumer_id(sink_name)).alias("id"), F.lit(sink_name).alias("name")).alias("consumer"),
        F.col("backfill_id").alias("backfill_id"),
    )


def _metadata_json(metadata: Column, columns: Sequence[str]) -> Column:
    """The metadata object's JSON, with the JSON text of the METADATA_TAIL columns the batch has spliced in as
    its last keys where the row has a value (a transaction annotation, capture/annotations.py; an enrichment,
    delivery/enrichment.py); rows without one have no such key."""
    text = F.to_json(metadata, _JSON_OPTIONS)
    extras = [F.coalesce(F.concat(F.lit(f',"{name}":'), F.col(name)), F.lit("")) for name in METADATA_TAIL
              if name in columns]
    if not extras:
        return text
    return F.concat(text.substr(F.lit(1), F.length(text) - 1), *extras, F.lit("}"))


def _raw_payload(record: str, changes: str, metadata: Column, texts: bool = False,
                 columns: Sequence[str] = ()) -> Column:
    # The record is spliced in as the exact JSON the log holds: no numeric precision is lost.
    return F.concat(
        F.lit('{"record":'), F.coalesce(F.col(record), F.lit("null")),
        F.lit(',"changes":'), F.coalesce(F.col(changes), F.lit("null")),
        F.lit(',"action":"'), F.col("action"),
        F.lit('","metadata":'), _metadata_json(metadata, columns),
        *([F.lit(',"texts":'), F.coalesce(F.col("texts"), F.lit("null"))] if texts else []), F.lit("}"),
    )


def _default_group(plan: SinkPlan, table: str | None) -> Column:
    if not plan.sink.message_grouping:
        return F.lit(None).cast("string")
    cols = plan.group_columns.get(table or "")
    if cols:
        return F.to_json(F.array(*[F.col("record")[c].cast("string") for c in cols]))
    return F.concat_ws("|", F.col("table_schema"), F.col("table_name"), F.col("pk"))


def group_keys(spark: SparkSession, plan: SinkPlan, batch: pa.Table,
               schemas: dict[str, list[dict[str, object]]]) -> dict[tuple[int, int], str | None]:
    """The ordering group of each row of `batch`, as run_stage computes it but without filter or
    transform: for rows the transform fails on, which must be parked under the group they belong to."""
    df = spark.createDataFrame(batch)
    out: dict[tuple[int, int], str | None] = {}
    tables = sorted({f"{s}.{t}" for s, t in zip(batch.column("table_schema").to_pylist(),
                                                  batch.column("table_name").to_pylist(), strict=True)})
    for table in tables:
        schema_name, _, table_name = table.partition(".")
        part = df.where((F.col("table_schema") == schema_name) & (F.col("table_name") == table_name))
        if plan.group_columns.get(table):
            part = table_frame(part, schemas.get(table) or [], plan.sink.name)
        for r in part.select("commit_lsn", "commit_idx", _default_group(plan, table).alias("g")).collect():
            out[(int(r[0]), int(r[1]))] = r[2]
    return out


def table_frame(df: DataFrame, columns: Sequence[dict[str, object]], sink_name: str) -> DataFrame:
    """Log rows of one table as filters and transforms see them: `record` and `changes` parsed into
    structs of the table's columns, and `metadata`; the raw JSON kept as record_json/changes_json."""
    st = record_schema(columns)
    df = df.withColumn("record_json", F.col("record")).withColumn("changes_json", F.col("changes"))
    df = df.withColumn("record", F.from_json("record_json", st))
    df = df.withColumn("changes", F.from_json("changes_json", st))
    return df.withColumn("metadata", _metadata(sink_name))


def run_stage(spark: SparkSession, plan: SinkPlan, batch: pa.Table,
              schemas: dict[str, list[dict[str, object]]]) -> pa.Table:
    """Filter, transform, route and group one batch; returns the OUTPUT_COLUMNS table in log order."""
    sink = plan.sink
    df = spark.createDataFrame(batch)
    df = df.where(F.col("action").isin(*sink.actions) | (F.col("action") == "read")
                  | (F.col("action").isin("truncate", "schema") & F.lit(takes_truncate(sink))))
    if not plan.needs_record:
        out = df.select("commit_lsn", "commit_idx", _default_group(plan, None).alias("group_key"),
                        F.lit(None).cast("string").alias("route"), _raw_payload("record", "changes", _metadata(sink.name), takes_texts(sink),
                                     df.columns).alias("payload"))
        return _sorted(out.toArrow())
    parts: list[DataFrame] = []
    tables = sorted({f"{s}.{t}" for s, t in zip(batch.column("table_schema").to_pylist(),
                                                  batch.column("table_name").to_pylist(), strict=True)})
    for table in tables:
        schema_name, _, table_name = table.partition(".")
        columns = schemas.get(table)
        if columns is None:
            raise KeyError(f"no column information for {table}: run the drain first")
        part = table_frame(df.where((F.col("table_schema") == schema_name) & (F.col("table_name") == table_name)),
                           columns, sink.name)
        if sink.filter:
            part = part.where(F.expr(sink.filter))
        group = _default_group(plan, table)
        route = F.expr(sink.route) if sink.route else F.lit(None).cast("string")
        part = part.withColumn("group_key", group).withColumn("route", route.cast("string"))
        if isinstance(sink.transform, dict):
            payload = F.to_json(F.struct(*[F.expr(e).alias(k) for k, e in sink.transform.items()]), _JSON_OPTIONS)
        elif plan.python_transform is not None:
            part = plan.python_transform(part)
            visible = [c for c in part.columns if c not in HIDDEN_COLUMNS]
            payload = F.to_json(F.struct(*visible), _JSON_OPTIONS)
        else:
            payload = _raw_payload("record_json", "changes_json", F.col("metadata"), takes_texts(sink),
                                   part.columns)
        parts.append(part.select("commit_lsn", "commit_idx", "group_key", "route", payload.alias("payload")))
    if not parts:
        return empty_output()
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return _sorted(out.toArrow())


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("commit_lsn", "ascending"), ("commit_idx", "ascending")])
