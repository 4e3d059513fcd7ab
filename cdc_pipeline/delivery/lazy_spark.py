"""The process's Spark session, started when a stage first needs it: a sink without Spark work (a mirror
without filter, transform or route takes the Arrow or relay path) never starts a JVM, so a restarted
`deliver` is delivering within a second instead of after the JVM's start (pyspark is not even imported).
Several deliverers share it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from cdc_pipeline.config import SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class LazySpark:
    """Stands in for a SparkSession: the first attribute asked of it starts the session (once, thread-safe)."""

    def __init__(self, config: SparkConfig) -> None:
        self._config = config
        self._session: SparkSession | None = None
        self._lock = threading.Lock()
        self._count = threading.Lock()
        self.waiting = 0  # threads starting the JVM or waiting for it: none has anything in flight to a sink

    def get(self) -> SparkSession:
        if self._session is not None:
            return self._session
        with self._count:
            self.waiting += 1
        try:
            with self._lock:
                if self._session is None:
                    from cdc_pipeline.delivery.spark_stage import spark_session  # pyspark with the JVM only

                    self._session = spark_session(self._config)
                return self._session
        finally:
            with self._count:
                self.waiting -= 1

    @property
    def started(self) -> bool:
        return self._session is not None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)
