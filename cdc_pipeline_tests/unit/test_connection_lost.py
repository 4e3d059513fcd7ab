"""session.connection_lost: a session the server ended or never opened is retried with a new one; a failing
statement or a refused login is not (a new session would fail the same way)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from cdc_pipeline.postgres.session import connection_lost


@pytest.mark.parametrize("exc", [psycopg.OperationalError("connection refused"), psycopg.InterfaceError("closed"),
                                 errors.AdminShutdown(), errors.CrashShutdown(), errors.CannotConnectNow(),
                                 errors.ConnectionFailure()], ids=type)
def test_lost(exc: BaseException) -> None:
    assert connection_lost(exc)


@pytest.mark.parametrize("exc", [errors.QueryCanceled(), errors.InvalidPassword(), errors.UniqueViolation(),
                                 errors.UndefinedTable(), errors.InvalidCatalogName(), ValueError("x"), OSError()],
                         ids=type)
def test_not_lost(exc: BaseException) -> None:
    assert not connection_lost(exc)
