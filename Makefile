.PHONY: demo test lint bench docs

# The main job: embedded PostgreSQL + sample load + pipeline + Dagster UI on http://127.0.0.1:3000
demo:
	./scripts/bootstrap
	.venv/bin/cdc-pipeline demo

# The whole test suite (real PostgreSQL, Spark, Dagster, Redis, RabbitMQ, NATS), after lint and the strict docs
# build (a broken link or anchor, or a page left out of the nav, fails it; the stale generated reference fails
# unit/test_docs_reference.py). Not `mkdocs -q`: with -q, mkdocs 1.6 drops the warnings --strict counts, and
# passes. Quiet on success, the whole log on failure; pytest ends with the 40 slowest tests (the suite has a
# 40-minute budget: what to look at first when it grows).
test:
	./scripts/bootstrap
	.venv/bin/ruff check cdc_pipeline cdc_pipeline_tests $(wildcard bench)
	@d=$$(mktemp -d) && out=$$(.venv/bin/mkdocs build --strict --site-dir "$$d" 2>&1); rc=$$?; rm -rf "$$d"; \
	  if [ $$rc -ne 0 ]; then echo "$$out"; exit $$rc; fi
	.venv/bin/python -m pytest -p no:cacheprovider -q -rfEs --durations=40 cdc_pipeline_tests

bench:
	./scripts/bootstrap
	.venv/bin/python bench/drain.py && .venv/bin/python bench/e2e.py && .venv/bin/python bench/sinks.py && .venv/bin/python bench/backfill.py

# Regenerate the reference pages (docs/reference/) from the code, then build the site into site/
docs:
	PYTHONPATH=$(CURDIR) .venv/bin/python -m cdc_pipeline.reference
	.venv/bin/mkdocs build --strict --site-dir site
