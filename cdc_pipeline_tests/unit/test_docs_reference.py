"""The docs' generated reference (docs/reference/) is what the code generates now, and covers every sink type.

A stale page fails here (and `make test`'s strict mkdocs build catches broken links): regenerate with
`python -m cdc_pipeline.reference`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

import cdc_pipeline
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.config.base import StrictModel
from cdc_pipeline.config.destinations import DESTINATION_MODELS, SINK_TYPES
from cdc_pipeline.reference import config_page, render_all, stale

DOCS = Path(cdc_pipeline.__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return render_all()


def test_generated_pages_are_up_to_date(pages: dict[str, str]) -> None:
    out = stale(DOCS, pages)
    assert not out, f"stale generated docs: {out}; run: python -m cdc_pipeline.reference"


def test_every_registered_sink_type_is_in_the_reference(pages: dict[str, str]) -> None:
    committed = (DOCS / "reference/config.md").read_text(encoding="utf-8")
    for kind, model in DESTINATION_MODELS.items():
        for text in (pages["reference/config.md"], committed):
            section = text.split(f"\n### `{kind}` ", 1)
            assert len(section) == 2, f"destination type {kind!r} is missing from the cdc.yaml reference"
            body = section[1].split("\n### ", 1)[0]
            for name in model.model_fields:
                assert f"| `{name}` |" in body, f"{kind}: key {name!r} is missing from its reference section"


def test_a_new_registry_line_reaches_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    class EchoDestination(StrictModel):
        type: Literal["echo"] = "echo"
        prefix: str = Field(min_length=1, description="Put before each key.")

    monkeypatch.setitem(SINK_TYPES, "echo", "cdc_pipeline.sinks.echo:EchoDestination")
    monkeypatch.setitem(DESTINATION_MODELS, "echo", EchoDestination)
    text = config_page.render()
    assert "\n### `echo` " in text
    assert "| `prefix` | string (not empty) | required | Put before each key. |" in text


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for info in model.model_fields.values():
        stack = [info.annotation]
        while stack:
            a = stack.pop()
            if isinstance(a, type) and issubclass(a, BaseModel):
                _models(a, seen)
            stack.extend(getattr(a, "__args__", ()))


def test_every_config_key_has_a_description() -> None:
    seen: set[type[BaseModel]] = set()
    _models(PipelineConfig, seen)
    missing = [f"{m.__name__}.{name}" for m in seen | set(DESTINATION_MODELS.values())
               for name, info in m.model_fields.items() if not info.description and name != "type"]
    assert not missing, f"add a Field(description=...) to: {missing}"


def test_the_short_readme_links_resolve_and_fits_two_screens() -> None:
    # docs/README_short.md is the README to be (written from the repository root); once it is swapped in,
    # README.md is checked instead.
    root = DOCS.parent
    readme = DOCS / "README_short.md" if (DOCS / "README_short.md").is_file() else root / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 160
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if not (root / t).exists()]
    assert not missing, f"{readme.name} links to missing files: {missing}"
