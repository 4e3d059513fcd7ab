"""Read cdc.yaml: YAML (safe, duplicate keys refused), ${VAR} interpolation, validation."""

import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import (
    ValidationError,
)

from cdc_pipeline.config.error_lines import validation_lines
from cdc_pipeline.config.errors import ConfigError, Loc, format_loc, kind_of, redact
from cdc_pipeline.config.models import PipelineConfig
from cdc_pipeline.config.sinks import ALIASED_KEYS

CONFIG_ENV_VAR = "CDC_CONFIG"
# Keys still accepted (configs in use carry them) that nothing reads any more: a warning at load says so.
DEPRECATED_KEYS: tuple[tuple[str, str], ...] = (
    ("drain", "tick_seconds"), ("drain", "idle_seconds"), ("delivery", "lag_trigger_messages"))


def load_config(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> PipelineConfig:
    """Load the config from ``path``, else from the file named by ``$CDC_CONFIG``.

    Raises ConfigError for any problem (missing file, YAML syntax, interpolation, validation).
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    if path is None:
        path = env.get(CONFIG_ENV_VAR) or None
        if path is None:
            raise ConfigError(f"no configuration file given: pass --config PATH or set {CONFIG_ENV_VAR}")
    name = os.fsdecode(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{name}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: not valid UTF-8 text (byte offset {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{name}: cannot read file ({e.strerror})") from None
    config = _parse(text, name, env)
    config._path = name
    return config


def parse_config(text: str, source_name: str, environ: Mapping[str, str] | None = None) -> PipelineConfig:
    """Parse YAML ``text``; ``source_name`` is the name used in error messages."""
    return _parse(text, source_name, os.environ if environ is None else environ)


def _parse(text: str, source: str, environ: Mapping[str, str]) -> PipelineConfig:
    data = _load_yaml(text, source)
    if data is None:
        raise ConfigError(f"{source}: file is empty (expected a mapping with source, tables, sinks, ...)")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: top level must be a mapping with source, tables, sinks, ... (got {kind_of(data)})"
        )
    problems: list[tuple[Loc, str]] = []
    data = _interpolate_tree(data, (), environ, problems)
    if problems:
        _raise_lines(source, problems)
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as e:
        _raise_lines(source, validation_lines(e, data))
    _warn_deprecated(config, source)
    return config


def _warn_deprecated(config: PipelineConfig, source: str) -> None:
    for section, key in DEPRECATED_KEYS:
        if key in getattr(config, section).model_fields_set:
            # FutureWarning: the category Python shows by default, meant for the people writing the config.
            warnings.warn(f"{source}: {section}.{key} is deprecated and has no effect; remove it",
                          FutureWarning, stacklevel=4)
    for i, sink in enumerate(config.sinks):
        for key in ALIASED_KEYS:
            if getattr(sink.destination, key, None) is not None:
                warnings.warn(f"{source}: sinks[{i}].destination.{key} is deprecated: it is the sink's {key} "
                              f"(sinks[{i}].{key}); move it up", FutureWarning, stacklevel=4)


def _raise_lines(source: str, problems: Sequence[tuple[Loc, str]]) -> NoReturn:
    lines = []
    for loc, msg in problems:
        where = format_loc(loc)
        lines.append(redact(f"{source}: {where}: {msg}" if where else f"{source}: {msg}"))
    raise ConfigError("\n".join(lines), lines) from None


# YAML ------------------------------------------------------------------------------------------------


# Aliases (`*a`) are shared nodes that every later pass (interpolation, validation) walks once per use:
# a few hundred bytes of nested aliases ("billion laughs") expand to billions of nodes. A config is small:
# refuse a document whose alias-expanded size passes this.
MAX_EXPANDED_NODES = 100_000


class _Loader(yaml.SafeLoader):
    """SafeLoader that records duplicate mapping keys (PyYAML silently keeps the last one), and refuses
    recursive aliases and alias expansions beyond MAX_EXPANDED_NODES, before anything is constructed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[int, str]] = []
        self._open_anchors: set[str] = set()
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{event.anchor} is inside its own anchor &{event.anchor} "
                    "(a recursive structure is not a valid config)", event.start_mark)
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open_anchors.add(anchor)
        node: yaml.Node = super().compose_node(parent, index)
        if anchor is not None:
            self._open_anchors.discard(anchor)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        size = 1 + sum(self._sizes.get(id(c), 1) for c in children)
        self._sizes[id(node)] = size
        if size > MAX_EXPANDED_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"aliases expand this document past {MAX_EXPANDED_NODES} nodes "
                "(nested aliases that multiply; write the values out instead)", event.start_mark)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            # Keys overridden after a `<<: *anchor` merge are intended, not duplicates.
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                self.duplicates.append((key_node.start_mark.line + 1, key_node.value))
            seen.add(key)
        return super().construct_mapping(node, deep)


def _load_yaml(text: str, source: str) -> Any:
    loader = _Loader(text)
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid YAML"
        if mark is None:
            raise ConfigError(redact(f"{source}: YAML syntax error: {problem}")) from None
        raise ConfigError(
            redact(f"{source}: line {mark.line + 1}: YAML syntax error: {problem} (column {mark.column + 1})")
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(redact(f"{source}: YAML error: {e}")) from None
    finally:
        loader.dispose()
    if loader.duplicates:
        lines = [
            f"{source}: line {line}: duplicate key {key!r} (each key may appear once per mapping)"
            for line, key in dict.fromkeys(loader.duplicates)
        ]
        raise ConfigError("\n".join(lines), lines)
    return data


# Interpolation -------------------------------------------------------------------------------------

# `$${` is an escaped literal `${`; `${NAME}` / `${NAME:-default}` are references; any other `${` is
# malformed (the optional group fails and only `${` matches).
_REFERENCE_RE = re.compile(
    r"\$\$\{|\$\{(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<sep>:-(?P<default>[^}]*))?\})?"
)


def _interpolate_tree(
    node: Any, loc: Loc, environ: Mapping[str, str], problems: list[tuple[Loc, str]]
) -> Any:
    # Interpolating the parsed tree (not the raw text) means a value with ':' or '#' can't change
    # the YAML structure, and the result is always the literal string.
    if isinstance(node, str):
        return _interpolate(node, loc, environ, problems) if "${" in node else node
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, (*loc, k), environ, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(v, (*loc, i), environ, problems) for i, v in enumerate(node)]
    return node


def _interpolate(text: str, loc: Loc, environ: Mapping[str, str], problems: list[tuple[Loc, str]]) -> str:
    def replace(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name = m.group("name")
        if name is None:
            problems.append(
                (
                    loc,
                    "invalid variable reference: use ${NAME} or ${NAME:-default} (write $${ for a literal ${)",
                )
            )
            return m.group(0)
        value = environ.get(name)
        if m.group("sep") is not None and not value:  # shell semantics: default when unset or empty
            return m.group("default")
        if value is None:
            problems.append((loc, f"environment variable {name} is not set"))
            return m.group(0)
        return value

    return _REFERENCE_RE.sub(replace, text)


# Validation errors -----------------------------------------------------------------------------------
