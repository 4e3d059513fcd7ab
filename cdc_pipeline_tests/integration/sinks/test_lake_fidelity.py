"""The fidelity type matrix (fidelity_values.py) through a Delta and an Iceberg mirror, read back with deltalake
and pyiceberg and compared with the source value by value: each lake value is turned back into PostgreSQL input
text here (a date's days, a timestamp's microseconds, a decimal, a float's shortest repr, an array's elements),
cast by PostgreSQL to the source column's type and compared with the source's value by output text (so `-0`, JSON text
and array contents count). A row holding a value its lake type cannot hold exactly (docs: values.md) is absent,
and parked with an error naming that column; every other row is there."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.delivery.lazy_spark import LazySpark
from cdc_pipeline.sinks.lake.values import EPOCH_DAYS
from cdc_pipeline_tests import fidelity_values as fv
from cdc_pipeline_tests.helpers import drain
from cdc_pipeline_tests.lake import lake_config, read_table

OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres -c extra_float_digits=1"
# Rows every table must deliver (the others hold a value no lake type holds exactly: infinity, 24:00:00, arrays
# with other bounds or dimensions, the last ~900 years of timestamps); a regression that refuses more fails here.
AT_LEAST = {"delta": {"fid_num": 8, "fid_text": 7, "fid_time": 5, "fid_netgeo": 5, "fid_range": 5, "fid_array": 2,
                       "fid_user": 2},
            # pyiceberg's writer also refuses dates and timestamps outside years 1 to 9999
            "iceberg": {"fid_num": 8, "fid_text": 7, "fid_time": 3, "fid_netgeo": 5, "fid_range": 5, "fid_array": 2,
                        "fid_user": 2}}


def civil(days: int) -> str:
    """PostgreSQL input text of a date given as days since 1970-01-01 (proleptic Gregorian, BC included)."""
    z = days + EPOCH_DAYS
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (m <= 2)
    return f"{y:04d}-{m:02d}-{d:02d}" if y > 0 else f"{1 - y:04d}-{m:02d}-{d:02d} BC"


def literal(value: Any, kind: pa.DataType) -> str | None:
    """PostgreSQL input text of a value read from a lake table."""
    if value is None:
        return None
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        items = [literal(v, kind.value_type) for v in value]
        return "{" + ",".join("NULL" if i is None else '"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"'
                              for i in items) + "}"
    if pa.types.is_date(kind):
        return civil(value.days if hasattr(value, "days") else value)
    if pa.types.is_timestamp(kind):
        day, micros = divmod(value, 86_400_000_000)
        date = civil(day)
        stamp = f"{micros // 3_600_000_000:02d}:{micros // 60_000_000 % 60:02d}:{micros // 1_000_000 % 60:02d}" \
                f".{micros % 1_000_000:06d}"
        bc = date.endswith(" BC")
        return f"{date.removesuffix(' BC')} {stamp}{'+00' if kind.tz else ''}{' BC' if bc else ''}"
    if pa.types.is_time(kind):
        return f"{value // 3_600_000_000:02d}:{value // 60_000_000 % 60:02d}:{value // 1_000_000 % 60:02d}" \
               f".{value % 1_000_000:06d}"
    if pa.types.is_boolean(kind):
        return "t" if value else "f"
    if pa.types.is_floating(kind):
        return repr(float(value))
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "\\x" + bytes(value).hex()
    if isinstance(value, Decimal | int):
        return str(value)
    return str(value)


def raw(table: pa.Table) -> list[dict[str, Any]]:
    """Rows with dates, timestamps and times as their integers (Python's datetime cannot hold them all)."""
    cols = {}
    for field in table.schema:
        column = table.column(field.name)
        if pa.types.is_date(field.type):
            column = column.cast(pa.int32())
        elif pa.types.is_timestamp(field.type) or pa.types.is_time(field.type):
            column = column.cast(pa.int64())
        elif pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
            inner = field.type.value_type
            if pa.types.is_date(inner):
                column = column.cast(pa.list_(pa.int32()))
            elif pa.types.is_timestamp(inner) or pa.types.is_time(inner):
                column = column.cast(pa.list_(pa.int64()))
        cols[field.name] = column
    return pa.table(cols).to_pylist()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_type_matrix_read_back(fmt, source_db, write_config, tmp_path):
    source_db.execute(fv.USER_TYPES)
    for t in fv.TABLES:
        source_db.execute(fv.create_sql(t).as_string())
        source_db.execute(fv.insert_sql(t).as_string())
    names = [f"public.{t.name}" for t in fv.TABLES]
    config = write_config(lake_config(source_db.dsn, names, fmt, "mirror", tmp_path))
    setup(config)
    with psycopg.connect(source_db.dsn) as conn:  # the rows again as changes (the inserts above predate the slot)
        for t in fv.TABLES:
            conn.execute(sql.SQL("UPDATE {} SET id = id + 100").format(sql.Identifier("public", t.name)))
    drain(config)
    Deliverer(config, config.sink("lake"), LazySpark(config.spark)).run(until_idle=True)
    with psycopg.connect(config.state_dsn) as conn:
        parked = {(r[0], int(r[1])): r[2] for r in conn.execute(
            "SELECT l.table_name, l.record->>'id', f.last_error FROM cdc_pipeline.failed_messages f "
            "JOIN cdc_pipeline.change_log l USING (commit_lsn, commit_idx) WHERE f.sink = 'lake'").fetchall()}
    with psycopg.connect(source_db.dsn, autocommit=True, options=OPTIONS) as conn:
        for t in fv.TABLES:
            _compare(conn, t, read_table(config, f"public.{t.name}"), parked, AT_LEAST[fmt][t.name])


def _compare(conn: psycopg.Connection, t: fv.Table, lake: pa.Table, parked: dict[tuple[str, int], str],
             at_least: int) -> None:
    got = {r["id"]: r for r in raw(lake)}
    refused = {i for (name, i) in parked if name == t.name}
    assert set(got) | refused == {100 + i for i in range(1, len(t.rows) + 1)}, t.name
    assert not set(got) & refused
    assert len(got) >= at_least, f"{t.name}: {len(got)} rows, refused: " + \
        "; ".join(parked[(t.name, i)] for i in sorted(refused))
    for i in refused:
        assert "cannot be written as" in parked[(t.name, i)] and f"of public.{t.name}" in parked[(t.name, i)]
    kinds = {f.name: f.type for f in lake.schema}
    for row_id, row in got.items():
        for column, type_sql in t.columns:
            text = literal(row[column], kinds[column])
            same = conn.execute(sql.SQL(
                "SELECT format('%s', {lit}::{type}) IS NOT DISTINCT FROM format('%s', {col}), format('%s', {col}) "
                "FROM {tbl} WHERE id = {id}"
            ).format(lit=sql.Literal(text), type=sql.SQL(type_sql), col=sql.Identifier(column),  # type: ignore[arg-type]
                     tbl=sql.Identifier("public", t.name), id=sql.Literal(row_id))).fetchone()
            assert same is not None and same[0], f"{t.name}.{column} id {row_id}: lake {text!r}, source {same[1]!r}"
