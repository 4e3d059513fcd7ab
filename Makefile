.PHONY: demo test lint bench

# The main job: embedded PostgreSQL + sample load + pipeline + Dagster UI on http://127.0.0.1:3000
demo:
	./scripts/bootstrap
	.venv/bin/cdc-pipeline demo

# The whole test suite (real PostgreSQL, Spark, Dagster, Redis, RabbitMQ, NATS)
test:
	./scripts/bootstrap
	.venv/bin/ruff check cdc_pipeline cdc_pipeline_tests $(wildcard bench)
	.venv/bin/python -m pytest -p no:cacheprovider -q -rfEs cdc_pipeline_tests

bench:
	./scripts/bootstrap
	.venv/bin/python bench/drain.py && .venv/bin/python bench/e2e.py && .venv/bin/python bench/sinks.py && .venv/bin/python bench/backfill.py
