# A clone's two commands (README: "Clone it as a template"): `make demo` and `make test`; both set up what they need.
.PHONY: setup lock demo test test-fast lint bench-partitions kafka-start kafka-stop cluster-start cluster-stop clean image servers-image

PY := .venv/bin/python
UV := .venv/bin/uv
PYTEST_ARGS ?=

setup:
	deploy/local/setup.sh

# requirements/*.txt: the exact versions and hashes that setup (dev.txt), the service image (service.txt) and the
# compaction image (compaction.txt) install, resolved by uv from pyproject.toml's ranges for every platform. Versions
# already locked stay unless pyproject.toml excludes them; `make lock UPGRADE=1` moves all to the newest allowed. The
# image locks are constrained by dev.txt: CI tests the very versions the images ship. airflow.txt is the Airflow that
# tests/infra/test_airflow_dag.py runs the DAG in (deploy/local/airflow.sh venv): a venv of its own, so unconstrained.
LOCK_ARGS = --quiet --universal --python-version 3.11 --generate-hashes --custom-compile-command "make lock" \
	$(if $(UPGRADE),--upgrade)
lock: setup
	$(UV) pip compile $(LOCK_ARGS) pyproject.toml --extra dev -o requirements/dev.txt
	$(UV) pip compile $(LOCK_ARGS) pyproject.toml --extra disk -c requirements/dev.txt -o requirements/service.txt
	$(UV) pip compile $(LOCK_ARGS) pyproject.toml --extra spark -c requirements/dev.txt -o requirements/compaction.txt
	$(UV) pip compile $(LOCK_ARGS) requirements/airflow.in -o requirements/airflow.txt

demo: setup
	deploy/local/kafka.sh start
	$(PY) -m tools.demo

# Lint first (a minute, so a wrong type or format fails before the long run), then the suite in three lanes
# (tests/run.sh). The Schema Registry is built here, once (Maven, ~2 minutes cold, then cached), beside the lint so
# that neither waits for the other and no test waits for it; `make demo` does not need it.
test: setup
	@mkdir -p .run; deploy/local/registry.sh build >.run/registry-build.log 2>&1 & build=$$!; \
	$(MAKE) --no-print-directory lint || { kill $$build 2>/dev/null; exit 1; }; \
	wait $$build || { cat .run/registry-build.log; echo "registry build failed (log above)"; exit 1; }
	tests/run.sh $(PYTEST_ARGS)

# The tests that need no server (every one not marked kafka, tests/plugins/servers.py): seconds, nothing started,
# no java needed; only .venv (make setup).
test-fast:
	.venv/bin/pytest -m "not kafka" $(PYTEST_ARGS)

# ruff, the import layers, the format, and mypy ([tool.mypy] in pyproject.toml: strict for pipeline/ and snapshots/).
lint:
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# Issue 23's measurement: a 600,000-record backlog drained at 3, 48 and 384 partitions, both PRODUCERS modes, medians of
# interleaved rounds, and the ratio to the 3-partition drain (BENCHMARKS.md, "Backlog drain"). BENCH_ARGS: more options
# (--sink postgres --dsn ..., --repeat 3, --partitions 3,384). Needs a broker (make kafka-start).
bench-partitions: setup
	.venv/bin/pipeline bench partitions $(BENCH_ARGS)

# The service and compaction images with podman (installed and configured by deploy/image/engine.sh when missing),
# on a Debian base built here: no image registry needed. deploy/image/fresh.sh runs `make demo` in a fresh container.
image:
	deploy/image/build.sh

# The Kafka and PostgreSQL images the tests start through testcontainers (the image tests build them too).
servers-image:
	deploy/image/servers.sh

kafka-start:
	deploy/local/kafka.sh start
kafka-stop:
	deploy/local/kafka.sh stop
cluster-start:
	deploy/local/kafka.sh --cluster start
cluster-stop:
	deploy/local/kafka.sh --cluster stop

clean:
	deploy/local/kafka.sh stop --wipe
	deploy/local/kafka.sh --cluster stop --wipe
	rm -rf .run
