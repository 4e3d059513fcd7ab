"""The Dagster layer's shape (issue 35): the streaming assets' bodies are a line each, the work done by the
`drain` and `delivery` resources, and no function in cdc_pipeline/defs/ is over 60 lines."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import cdc_pipeline.defs
from cdc_pipeline.defs.capture import build_change_log_asset
from cdc_pipeline.defs.delivery import build_sink_asset

DEFS = Path(cdc_pipeline.defs.__file__).parent
MAX_LINES = 60


def test_no_function_in_defs_is_over_60_lines() -> None:
    long = []
    for path in sorted(DEFS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.name}:{node.name} ({lines} lines)")
    assert not long, long


def test_the_streaming_assets_bodies_are_one_line() -> None:
    for builder in (build_change_log_asset, build_sink_asset):
        tree = ast.parse(inspect.getsource(builder))
        [asset] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("_")]
        assert len(asset.body) == 1 and "stream" in ast.unparse(asset.body[0]), ast.unparse(asset)
