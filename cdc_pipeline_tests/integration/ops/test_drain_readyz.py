"""`/readyz` of a real `drain --metrics-port` through an outage of its source (cut at a TCP proxy; the
state database stays up): not ready while the source is gone, naming it, alive (`/healthz`) all along;
ready again once it is back, and streaming for real (a change written after the outage is logged)."""

from __future__ import annotations

from collections.abc import Callable

from psycopg import conninfo

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.demo.dagster_dev import free_port
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config, wait_until
from cdc_pipeline_tests.integration.ops.test_metrics import _get
from cdc_pipeline_tests.netfaults import TcpProxy
from cdc_pipeline_tests.processes import spawn, stop


def _logged(db: Database) -> int:
    return int(db.execute("SELECT count(*) FROM cdc_pipeline.change_log")[0][0])


def test_drain_readyz_follows_an_outage_of_its_source(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    parts = conninfo.conninfo_to_dict(source_db.dsn)
    proxy = TcpProxy(int(parts.get("port") or 5432)).start()
    via_proxy = conninfo.make_conninfo(source_db.dsn, host="127.0.0.1", port=str(proxy.port))
    source_db.execute("CREATE TABLE public.t (id integer PRIMARY KEY)")
    data = mirror_config(via_proxy, db_factory().dsn, ["public.t"])
    data["state"] = {"dsn": source_db.dsn}  # the same server, not through the proxy: only the source goes
    config = write_config(data)
    setup(config)
    port = free_port()
    proc = spawn(config.path, "drain", "--metrics-port", str(port))
    try:
        ready = lambda: proc.poll() is not None or _get(port, "/readyz")[0] == 200  # noqa: E731
        wait_until(ready, 120, "the drain ready")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        source_db.execute("INSERT INTO public.t VALUES (1)")
        wait_until(lambda: _logged(source_db) == 1, 60, "a change logged")

        proxy.stop()
        wait_until(lambda: _get(port, "/readyz")[0] == 503, 60, "/readyz not ready while the source is down")
        code, body = _get(port, "/readyz")
        assert "source" in body, body
        assert _get(port, "/healthz")[0] == 200  # alive, only not ready
        source_db.execute("INSERT INTO public.t VALUES (2)")  # written during the outage

        proxy.start()
        wait_until(ready, 120, "/readyz ready once the source is back")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        source_db.execute("INSERT INTO public.t VALUES (3)")
        wait_until(lambda: _logged(source_db) == 3, 60, "the changes of and after the outage logged")
        assert stop(proc, 15, 60)[0] == 0
    finally:
        proxy.stop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
