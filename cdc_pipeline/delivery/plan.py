"""A sink's stage, resolved once per run, and what both stages (Arrow and Spark) agree on: the output's
columns and the message's fixed parts. No pyspark here: a sink with no Spark work never imports it."""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.sinks import sink_class

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

OUTPUT_COLUMNS = ("commit_lsn", "commit_idx", "group_key", "route", "payload")
# Log batch columns of JSON text spliced into a message's metadata as its last keys, where not null.
METADATA_TAIL = ("annotations", "enrichment")


def consumer_id(sink_name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"cdc_pipeline:sink:{sink_name}"))


@dataclass(frozen=True)
class SinkPlan:
    """A sink's filter/transform/route/grouping, resolved once per run."""

    sink: SinkConfig
    group_columns: dict[str, list[str]]  # table -> grouping columns from the record
    python_transform: Callable[[DataFrame], DataFrame] | None

    @classmethod
    def build(cls, config: PipelineConfig, sink: SinkConfig) -> SinkPlan:
        groups = {t.qualified: list(t.group_columns) for t in config.tables
                  if t.group_columns and t.qualified in sink.tables}
        fn = None
        if isinstance(sink.transform, str):
            fn = load_function(sink.transform)
        return cls(sink, groups, fn)

    @property
    def needs_record(self) -> bool:
        s = self.sink
        return bool(s.filter or s.transform or s.route or (s.message_grouping and self.group_columns))


def load_function(ref: str) -> Callable[[DataFrame], DataFrame]:
    module_name, _, attr = ref.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise TypeError(f"transform {ref!r} is not callable")
    return fn  # type: ignore[no-any-return]


# Columns a python transform's result carries for delivery, not for the message body.
HIDDEN_COLUMNS = {"commit_lsn", "commit_idx", "group_key", "route", "record_json", "changes_json", "xid", "pk",
           "table_schema", "table_name", "commit_ts", "backfill_id", "texts", "annotations", "enrichment"}
_OUTPUT_TYPES = {"commit_lsn": pa.int64(), "commit_idx": pa.int32(), "group_key": pa.string(),
                 "route": pa.string(), "payload": pa.string()}


def empty_output() -> pa.Table:
    return pa.table({c: pa.array([], t) for c, t in _OUTPUT_TYPES.items()})


def takes_truncate(sink: SinkConfig) -> bool:
    """TRUNCATE is not a message action: only a sink that can act on it (a mirror) is handed it."""
    return sink_class(sink).takes_truncates(sink)


def takes_texts(sink: SinkConfig) -> bool:
    """A mirror's messages carry the log's ``texts`` (values whose JSON does not give the mirror the source's
    value back; postgres/pgtypeinfo.py) under a ``texts`` key no consumer sees. Not with a transform: the
    values it computes are the ones to write."""
    return sink_class(sink).takes_texts(sink) and not sink.transform
