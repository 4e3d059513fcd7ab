"""Validators and the base model shared by every config section."""

import re
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
)

_IDENT = r"[A-Za-z_][A-Za-z0-9_$]{0,62}"
_IDENT_RE = re.compile(rf"^{_IDENT}$")
_QUALIFIED_RE = re.compile(rf"^(?:(?P<schema>{_IDENT})\.)?(?P<table>{_IDENT})$")
SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")
SINK_NAME_RE = re.compile(r"^[A-Za-z0-9_\-]{1,63}$")
CALLABLE_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A destination's own `batch_size` / `max_in_flight`, from before they were the sink's (config/sinks.py folds them).
ALIAS = ("Deprecated alias of the sink's `{key}` (still read, with a warning; when both are set this one is "
         "used): move it up to the sink.")
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def qualify(name: str) -> str:
    """'schema.table' stays, bare 'table' means 'public.table' (PostgreSQL's default schema)."""
    m = _QUALIFIED_RE.match(name)
    if m is None:
        raise ValueError(f"must be 'schema.table' or 'table' (got {name!r})")
    return f"{m['schema'] or 'public'}.{m['table']}"


def identifier(value: str) -> str:
    if not _IDENT_RE.match(value):
        raise ValueError(
            f"must be an identifier of 1-63 letters, digits, '_' or '$', not starting with a digit (got {value!r})"
        )
    return value


def url_with_scheme(value: str, schemes: tuple[str, ...]) -> str:
    parts = urlsplit(value)
    if parts.scheme.lower() not in schemes or not (parts.netloc or parts.path):
        # Never echo the URL: it may carry credentials.
        raise ValueError("must be a URL starting with " + " or ".join(f"{s}://" for s in schemes))
    return value


DSN_MESSAGE = ("is not a valid PostgreSQL connection string (a URL like postgresql://USER@HOST:PORT/DB with '%' and "
               "other reserved characters of the password percent-encoded, or key=value pairs); the value is not "
               "shown because it may hold a password")


def dsn_parses(value: str) -> bool:
    from psycopg import conninfo  # the parser libpq itself uses

    try:
        conninfo.conninfo_to_dict(value)
    except Exception:
        return False
    return True


def dsn(value: str) -> str:
    """Parse the DSN the way libpq will, so a mistyped one fails at load with a message that never echoes it
    (libpq's own messages quote the offending token, which is often the password). A bare word (no ``=``
    nor ``://``) passes here, as a placeholder in configs that are only parsed; the commands that connect
    reject it first (`PipelineConfig.check_dsns`)."""
    if ("=" in value or "://" in value) and not dsn_parses(value):
        raise ValueError(DSN_MESSAGE)
    return value


def string_map(value: Any) -> Any:
    """Coerce scalar mapping values to strings (YAML reads `4` as int and `true` as bool)."""
    if not isinstance(value, Mapping):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            item = "true" if item else "false"  # Spark and HTTP want lower-case booleans, not "True"
        elif isinstance(item, int | float):
            item = str(item)
        out[key] = item
    return out


class StrictModel(BaseModel):
    # hide_input_in_errors: a ValidationError printed by code that builds models directly must not
    # leak DSNs either. defer_build: a model's validator is built when first used, not as its class is
    # defined; a config load builds PipelineConfig's with its sections inline, not one per model (~5 ms of
    # every command's start-up).
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True,
                              defer_build=True)


# A PostgreSQL connection string, checked at load (see `dsn`).
Dsn = Annotated[str, AfterValidator(dsn)]


def pipeline_name(value: str) -> str:
    """A sink's or API source's name: it names locks, offsets and Dagster assets."""
    if not SINK_NAME_RE.match(value):
        raise ValueError(f"must be 1-63 letters, digits, '_' or '-' (got {value!r})")
    return value


Name = Annotated[str, AfterValidator(pipeline_name)]
