"""The `cdc.yaml` reference, from the pydantic models: every key with its type, default, constraint and
description, one table per section, and one per destination type of the registry."""

from __future__ import annotations

import json
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import AfterValidator, BaseModel, SecretStr
from pydantic.fields import FieldInfo

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.config.destinations import DESTINATION_MODELS, SINK_TYPES
from cdc_pipeline.reference.markdown import code, table

_VALIDATOR_NAMES = {"dsn": "DSN", "pipeline_name": "name"}  # Annotated string types, by their validator

INTRO = """\
# `cdc.yaml` reference

The path comes from `--config` or `$CDC_CONFIG`. `${VAR}` and `${VAR:-default}` are interpolated from the
environment in values (`$${` is a literal `${`). Unknown keys are errors; every error names the file, the
key and the problem, and the process exits 2 before connecting anywhere. Secrets come from the
environment only. See [Configuration](../explanation/configuration.md) for how the keys work together.

"""


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _section_name(model: type[BaseModel]) -> str:
    return _PATHS.get(model, model.__name__)


_PATHS: dict[type[BaseModel], str] = {}


def type_text(annotation: Any, metadata: list[Any] | None = None) -> str:
    """A type as a reader of YAML sees it: `integer`, `list of string`, `"stop" or "backfill"`, a link to a
    nested section."""
    for meta in metadata or ():
        name = getattr(getattr(meta, "func", None), "__name__", None)
        if isinstance(meta, AfterValidator) and name in _VALIDATOR_NAMES:
            return _VALIDATOR_NAMES[name]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_text(args[0], list(args[1:]))
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        nested = [a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(nested) > 1:  # a discriminated union: one section per member
            return "one of " + ", ".join(f"[{_tag(m)}](#{_anchor(m)})" for m in nested)
        text = " or ".join(type_text(a) for a in members)
        return text + (" or null" if len(members) < len(args) else "")
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin is list:
        return "list of " + type_text(args[0])
    if origin is dict:
        return f"mapping of {type_text(args[0])} to {type_text(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{_section_name(annotation)}](#{_anchor(annotation)})"
    if annotation is SecretStr:
        return "string (secret)"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


def _tag(model: type[BaseModel]) -> str:
    field = model.model_fields.get("type")
    return str(field.default) if field is not None else model.__name__


def _constraint(info: FieldInfo) -> str:
    out = []
    for meta in info.metadata:
        if isinstance(meta, at.Gt):
            out.append(f"> {meta.gt}")
        elif isinstance(meta, at.Ge):
            out.append(f">= {meta.ge}")
        elif isinstance(meta, at.Le):
            out.append(f"<= {meta.le}")
        elif isinstance(meta, at.MinLen) and meta.min_length:
            out.append("not empty")
    return ", ".join(out)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its defaults"
    return code(json.dumps(value))


def _rows(model: type[BaseModel]) -> list[list[str]]:
    rows = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        kind = type_text(info.annotation, info.metadata)
        constraint = _constraint(info)
        about = info.description or ("Selects this type." if name == "type" else "")
        rows.append([code(key), kind + (f" ({constraint})" if constraint else ""), _default(info), about])
    return rows


def _collect(model: type[BaseModel], path: str, order: list[type[BaseModel]]) -> None:
    for info_name, info in model.model_fields.items():
        key = info.alias or info_name
        for child in _nested_of(info.annotation):
            if child in _PATHS or child in DESTINATION_MODELS.values():
                continue
            many = get_origin(info.annotation) is list
            members = len(_nested_of(info.annotation)) > 1  # a union: name the member by its type
            _PATHS[child] = f"{path}{key}{'[]' if many else ''}" + (f" ({_tag(child)})" if members else "")
            order.append(child)
            _collect(child, _PATHS[child] + ".", order)


def _nested_of(annotation: Any) -> list[type[BaseModel]]:
    out: list[type[BaseModel]] = []

    def walk(a: Any) -> None:
        if isinstance(a, type) and issubclass(a, BaseModel):
            out.append(a)
        for arg in get_args(a):
            walk(arg)

    walk(annotation)
    return out


def render() -> str:
    _PATHS.clear()
    order: list[type[BaseModel]] = []
    _collect(PipelineConfig, "", order)
    for kind, model in DESTINATION_MODELS.items():
        _PATHS[model] = f"sinks[].destination ({kind})"
    parts = [INTRO, "## Top level\n\n", table(["key", "type", "default", "description"], _rows(PipelineConfig))]
    for model in order:
        parts += [f"\n## `{_PATHS[model]}` {{#{_anchor(model)}}}\n\n",
                  table(["key", "type", "default", "description"], _rows(model))]
    parts.append("\n## Destination types\n\nA sink's `destination:` is one of these, chosen by `type`; the "
                 "registry `cdc_pipeline/config/destinations.py` lists them (see "
                 "[Write a sink](../how-to/write-a-sink.md)).\n")
    for kind in SINK_TYPES:
        model = DESTINATION_MODELS[kind]
        doc = (model.__doc__ or "").strip() if model.__doc__ != BaseModel.__doc__ else ""
        required = ", ".join(f"{n}: ..." for n, f in model.model_fields.items() if f.is_required())
        parts += [f"\n### `{kind}` {{#{_anchor(model)}}}\n\n", f"{doc}\n\n" if doc else "",
                  f"`destination: {{type: {kind}{', ' + required if required else ''}}}`\n\n",
                  table(["key", "type", "default", "description"], _rows(model))]
        nested: list[type[BaseModel]] = []  # a destination's own sections (an iceberg sink's `catalog`)
        _collect(model, f"sinks[].destination ({kind}).", nested)
        for child in nested:
            parts += [f"\n#### `{_PATHS[child]}` {{#{_anchor(child)}}}\n\n",
                      table(["key", "type", "default", "description"], _rows(child))]
    return "".join(parts)
