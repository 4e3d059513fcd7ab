"""Example Python transforms (`transform: "cdc_pipeline_tests.transforms_example:NAME"`), used by the tests.

A transform takes the stage's DataFrame (one row per message: `record`, `changes`, `action`, `metadata`
plus bookkeeping columns) and returns one; every column it leaves that is not bookkeeping becomes a field
of the message, so a transform must keep `commit_lsn`, `commit_idx`, `group_key` and `route`.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

# A small static dimension (account -> tier); account 30 deliberately has no tier.
TIERS = [(10, "gold"), (20, "silver")]


def enrich(df: DataFrame) -> DataFrame:
    """Beyond expressions: a (broadcast) left join with a static DataFrame adds the account's tier."""
    tiers = df.sparkSession.createDataFrame(TIERS, "tier_account int, tier string")
    joined = df.join(F.broadcast(tiers), F.col("record.account_id") == F.col("tier_account"), "left")
    return joined.drop("tier_account").withColumn("tier", F.coalesce(F.col("tier"), F.lit("none")))


def _label(table: str | None, row_id: int | None) -> str:
    return f"{(table or '?').upper()}#{row_id}"


def label_udf(df: DataFrame) -> DataFrame:
    """A Python UDF: runs on Spark's Python workers, which must be this interpreter (imports this module)."""
    label = F.udf(_label, T.StringType())
    return df.withColumn("label", label(F.col("metadata.table_name"), F.col("record.id")))


def missing_column(df: DataFrame) -> DataFrame:
    """Broken on purpose: names a column the records do not have (Spark's analysis rejects it)."""
    return df.withColumn("oops", F.col("record.no_such_column") + 1)


def drops_bookkeeping(df: DataFrame) -> DataFrame:
    """Broken on purpose: keeps only the message fields, losing what delivery needs to order them."""
    return df.select("record", "action")


not_callable = 42
