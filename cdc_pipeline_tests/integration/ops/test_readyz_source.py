"""`/readyz` of a process whose readiness runs `status`'s queries (deliver, drain) names the database that
failed: the source when only the source is down, not the state database."""

from __future__ import annotations

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.ops.health import register_pipeline_metrics
from cdc_pipeline.ops.metrics import PipelineCollector
from cdc_pipeline_tests.helpers import mirror_config
from cdc_pipeline_tests.kafka_broker import free_port


def test_readyz_blames_the_source_when_only_the_source_is_down(source_db, db_factory, write_config):
    state = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    data = mirror_config(source_db.dsn, db_factory().dsn, ["public.t"])
    data["state"] = {"dsn": state.dsn}
    setup(write_config(data))
    data["source"]["dsn"] = f"postgresql://nobody@127.0.0.1:{free_port()}/nothing"  # nothing listens there
    collector, checks = register_pipeline_metrics(write_config(data), lambda: [])
    try:
        assert [check() for check in checks] == ["source database: OperationalError"]
    finally:
        from cdc_pipeline.core.metrics_registry import REGISTRY

        REGISTRY.unregister(collector)
    ok = PipelineCollector(lambda: {}, lambda: [])
    assert ok.status() == {} and ok.status_error is None
