"""`python -m cdc_pipeline.reference [--check] [DOCS_DIR]`: regenerate the reference pages (or list stale ones)."""

import sys
from pathlib import Path

from cdc_pipeline.reference import stale, write_all


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    docs = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "docs"
    if check:
        out = stale(docs)
        for path in out:
            print(f"stale: docs/{path} (run: python -m cdc_pipeline.reference)")
        return 1 if out else 0
    for path in write_all(docs):
        print(f"wrote docs/{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
