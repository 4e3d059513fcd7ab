"""A delivery process whose sinks have no Spark work never needs pandas: tell pyarrow so.

pyarrow asks whether pandas is installed on its first array built from Python values (is this a
DataFrame?) and imports it to find out: ~0.3-1 s of a `deliver`'s start-up, for nothing when no sink
goes through Spark. Asked once while `import pandas` fails, pyarrow remembers "no pandas" for those
questions; anything that really needs pandas later (`to_pandas`) still imports it, as pyarrow asks
again then.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading


def prepare_arrow(needs_spark: bool) -> None:
    """Before the first batch: without Spark work, pyarrow learns there is no pandas to look for; with
    it, pandas (which pyspark and pyarrow import at the first batch anyway) is imported in the
    background while this process waits on its databases and the JVM."""
    if needs_spark:
        threading.Thread(target=importlib.import_module, args=("pandas",), daemon=True).start()
        return
    if "pandas" in sys.modules:  # imported already: nothing to save
        return
    import pyarrow as pa

    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0])  # the first such array: pyarrow tries pandas once and keeps the answer
    finally:
        sys.meta_path.remove(blocker)


class _NoPandas(importlib.abc.MetaPathFinder):
    """`import pandas` fails while this finder is first on `sys.meta_path`."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is not used by this process")
