"""Turn pydantic validation errors into one line per problem at the key path the user wrote."""

import difflib
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ValidationError,
)

from cdc_pipeline.config.destinations import DESTINATION_TYPES
from cdc_pipeline.config.errors import PROBLEMS, Loc, kind_of, redact
from cdc_pipeline.config.models import PipelineConfig

# Paths under these keys may hold credentials: never show the offending input for them.
_SENSITIVE_KEYS = frozenset({"dsn", "url", "headers", "conf", "hmac_secret_env", "base_url", "token_url",
                             "token_env", "client_id_env", "client_secret_env", "secret_access_key",
                             "session_token", "api_key", "access_key_id"})

_TYPE_MESSAGES: dict[str, str] = {
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


def _show(value: Any, sensitive: bool) -> str:
    if sensitive or isinstance(value, Mapping | list | tuple):
        return kind_of(value)
    text = repr(value)
    return redact(text if len(text) <= 80 else text[:77] + "...")


def validation_lines(exc: ValidationError, data: Any) -> list[tuple[Loc, str]]:
    lines: list[tuple[Loc, str]] = []
    for err in exc.errors(include_url=False):
        loc = _user_loc(err["loc"], data)
        ctx: dict[str, Any] = err.get("ctx") or {}
        kind = err["type"]
        if kind == PROBLEMS:
            lines.extend(((*loc, *rel), msg) for rel, msg in ctx["problems"])
            continue
        sensitive = any(el in _SENSITIVE_KEYS for el in loc)
        got = f" (got {_show(err.get('input'), sensitive)})"
        if kind == "missing":
            lines.append((loc, "required key is missing"))
        elif kind == "extra_forbidden":
            lines.append((loc[:-1], _unknown_key(loc, data)))
        elif kind == "literal_error":
            lines.append((loc, f"must be one of {_one_of(ctx['expected'])}{got}"))
        elif kind == "union_tag_invalid":
            lines.append(((*loc, "type"), f"must be one of {ctx['expected_tags']} (got {ctx['tag']!r})"))
        elif kind == "union_tag_not_found":
            expected = ", ".join(repr(t) for t in DESTINATION_TYPES)
            lines.append(((*loc, "type"), f"required key is missing (one of {expected})"))
        elif kind in _TYPE_MESSAGES:
            lines.append((loc, _TYPE_MESSAGES[kind] + got))
        elif kind in ("too_short", "string_too_short"):
            n = ctx.get("min_length", 1)
            lines.append((loc, "must not be empty" if n == 1 else f"must have at least {n} items"))
        elif kind in ("too_long", "string_too_long"):
            lines.append(
                (
                    loc,
                    f"must have at most {ctx.get('max_length')} {'characters' if 'string' in kind else 'items'}",
                )
            )
        elif kind in _BOUND_MESSAGES:
            key, words = _BOUND_MESSAGES[kind]
            bound = ctx[key]
            if isinstance(bound, float) and bound.is_integer():
                bound = int(bound)  # "greater than 0", not "0.0", for float fields
            lines.append((loc, f"must be {words} {bound}{got}"))
        elif kind in ("value_error", "assertion_error") and "error" in ctx:
            lines.append((loc, str(ctx["error"])))
        else:
            lines.append((loc, err["msg"]))
    return lines


_BOUND_MESSAGES: dict[str, tuple[str, str]] = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _one_of(expected: str) -> str:
    # pydantic writes "'a', 'b' or 'c'"; the contract's wording is "one of 'a', 'b', 'c'".
    head, sep, tail = expected.rpartition(" or ")
    return f"{head}, {tail}" if sep else expected


def _step(node: Any, el: str | int) -> Any:
    if isinstance(node, Mapping):
        return node.get(el)
    if isinstance(node, list) and isinstance(el, int) and 0 <= el < len(node):
        return node[el]
    return None


def _user_loc(loc: Sequence[str | int], data: Any) -> Loc:
    """Pydantic's location, minus elements the user never wrote (discriminated-union tags)."""
    out: list[str | int] = []
    node = data
    for el in loc:
        if el == "[key]":  # pydantic's marker for "the key itself"
            continue
        if isinstance(node, Mapping) and el not in node and node.get("type") == el:
            continue  # `destination.postgres.mode` -> `destination.mode`
        out.append(el)
        node = _step(node, el)
    return tuple(out)


def _unknown_key(loc: Loc, data: Any) -> str:
    key = loc[-1]
    allowed = _allowed_keys(loc[:-1], data)
    message = f"unknown key {str(key)!r}"
    if not allowed:
        return message
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
    if close:
        return f"{message} (did you mean {close[0]!r}?)"
    return f"{message} (allowed: {', '.join(allowed)})"


def _allowed_keys(loc: Loc, data: Any) -> list[str]:
    """The keys the model at ``loc`` accepts, found by walking the model types along the data."""
    annotation: Any = PipelineConfig
    node = data
    for el in loc:
        model = _resolve_model(annotation, node)
        if model is not None:
            field = next((f for name, f in model.model_fields.items() if el in (name, f.alias)), None)
            if field is None:
                return []
            annotation = field.annotation
        else:
            annotation = _strip_annotated(annotation)
            origin = get_origin(annotation)
            if origin is list and isinstance(el, int):
                annotation = get_args(annotation)[0]
            elif origin is dict:
                annotation = get_args(annotation)[1]
            else:
                return []
        node = _step(node, el)
    model = _resolve_model(annotation, node)
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _strip_annotated(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _resolve_model(annotation: Any, node: Any) -> type[BaseModel] | None:
    annotation = _strip_annotated(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        members = [_strip_annotated(a) for a in get_args(annotation) if a is not type(None)]
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if len(members) == 1:
            return _resolve_model(members[0], node)
        tag = node.get("type") if isinstance(node, Mapping) else None
        for model in models:  # discriminated union: pick the member whose `type` literal matches
            type_field = model.model_fields.get("type")
            if type_field is not None and tag in get_args(type_field.annotation):
                return model
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
