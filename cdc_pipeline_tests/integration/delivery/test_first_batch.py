"""A delivery session's first block is short (reader.FIRST_BATCH) and each next one twice the last, up to
`delivery.batch_size`: sending starts once the first is staged, each next block is loaded and staged while
the one before it is sent; everything still arrives, in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.reader import FIRST_BATCH
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config


def test_the_first_block_is_short_and_the_next_ones_double(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig],
        spark: Any) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v text NOT NULL)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    rows = FIRST_BATCH + 6000
    source_db.execute("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, %s) g", (rows,))
    source_db.execute("UPDATE public.t SET v = v || '!' WHERE id % 7 = 0")
    drain(config)
    stats = deliver(config, spark)
    changes = rows + rows // 7
    # blocks of FIRST_BATCH, 2x, 4x (the mirror takes a block as one call), then the rest
    assert changes > 7 * FIRST_BATCH
    assert (stats.delivered, stats.batches) == (changes, 4), stats
    assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t")
