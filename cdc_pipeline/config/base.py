"""Validators and the base model shared by every config section."""

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import (
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
    # leak DSNs either.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True)
