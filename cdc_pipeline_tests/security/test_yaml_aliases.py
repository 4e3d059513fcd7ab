"""YAML aliases (issue 15.8): a billion-laughs config fails fast with a clear error; a recursive alias is a
clear error, not RecursionError; ordinary anchors and merge keys still work."""

from __future__ import annotations

import time

import pytest

from cdc_pipeline.config import ConfigError, load_config

BOMB = "source: {dsn: x}\ntables: [{name: t}]\nspark:\n  conf:\n    a0: &a0 ['${HOME}', '${HOME}', '${HOME}', '${HOME}', '${HOME}', '${HOME}', '${HOME}', '${HOME}', '${HOME}']\n" + "".join(
    f"    a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
    for i in range(1, 10))


def test_billion_laughs_fails_fast(tmp_path) -> None:
    path = tmp_path / "cdc.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 1500
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={"HOME": "/root"})
    assert time.monotonic() - started < 2
    assert "aliases expand this document past 100000 nodes" in str(info.value)
    assert str(info.value).startswith(f"{path}: line ")


def test_recursive_alias_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "cdc.yaml"
    path.write_text("source: {dsn: x}\ntables: [{name: t}]\nspark:\n  conf: &loop {a: *loop}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "alias *loop is inside its own anchor &loop" in str(info.value)


def test_plain_anchors_and_merge_keys_still_work(tmp_path) -> None:
    path = tmp_path / "cdc.yaml"
    path.write_text("source: {dsn: x}\ntables: [{name: t, group_columns: &g [a, b]}, {name: u, group_columns: *g}]\n"
                    "spark:\n  conf: &base {x: '1'}\ndelivery: {}\n")
    config = load_config(path, environ={})
    assert config.tables[1].group_columns == ["a", "b"]
