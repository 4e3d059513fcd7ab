"""The Iceberg sink's catalog: SQL (the state database by default, its tables in the state schema; or a
configured PostgreSQL / SQLite database) or REST. Credentials come from the config (`${VAR}`), never logged."""

from __future__ import annotations

from typing import Any

from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import URL


def sqlalchemy_url(dsn: str, search_path: str | None = None) -> str:
    """A SQLAlchemy URL (psycopg 3 driver) for a PostgreSQL DSN or URL; other SQLAlchemy URLs as they are."""
    if "://" in dsn and not dsn.startswith(("postgresql://", "postgres://")):
        return dsn  # sqlite:///..., postgresql+psycopg://...: already SQLAlchemy's
    params: dict[str, Any] = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    query = {k: v for k, v in params.items() if k not in ("user", "password", "host", "port", "dbname")}
    if search_path:
        query["options"] = (query.get("options", "") + f" -csearch_path={search_path}").strip()
    host = params.get("host")
    if host and host.startswith("/"):  # a Unix socket directory goes in the query
        query["host"] = host
        host = None
    url = URL.create("postgresql+psycopg", username=params.get("user"), password=params.get("password"),
                     host=host, port=int(params["port"]) if params.get("port") else None,
                     database=params.get("dbname"), query=query)
    return url.render_as_string(hide_password=False)


def load_catalog(dest: Any, state_dsn: str | None, state_schema: str) -> Any:
    """The pyiceberg catalog `dest.catalog` names (`state_dsn`: where a default SQL catalog lives)."""
    cfg = dest.catalog
    props = {"warehouse": dest.warehouse, **cfg.properties}
    if cfg.type == "rest":
        from pyiceberg.catalog.rest import RestCatalog

        if not cfg.uri:
            raise ValueError("an iceberg REST catalog needs `catalog.uri`")
        return RestCatalog(cfg.name, uri=cfg.uri, **props)
    from pyiceberg.catalog.sql import SqlCatalog

    if cfg.uri:
        uri = sqlalchemy_url(cfg.uri)
    elif state_dsn:
        uri = sqlalchemy_url(state_dsn, search_path=state_schema)
    else:
        raise ValueError("no state database to keep the iceberg catalog in")
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(5):
        try:
            return SqlCatalog(cfg.name, uri=uri, **props)
        except (IntegrityError, ProgrammingError):  # another sink created the catalog's tables at the same time
            if attempt == 4:
                raise
    raise AssertionError("unreachable")
