# The two commands: `make demo` and `make test`. Both set up everything they need first.
.PHONY: setup demo test test-fast lint kafka-start kafka-stop cluster-start cluster-stop clean

PY := .venv/bin/python
PYTEST_ARGS ?=

setup:
	deploy/local/setup.sh

demo: setup
	deploy/local/kafka.sh start
	$(PY) -m tools.demo

test: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/pytest $(PYTEST_ARGS)

lint:
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/ruff format --check .

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
