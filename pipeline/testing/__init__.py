"""Tools to prove a service exactly-once, run against real servers. The runtime never imports this package.

oracle/              the judge: the offline reference fold of `app.process` and the checks, over plain data;
                     no Kafka client and no runtime code, on purpose (an import-linter contract keeps it so)
drain.py             reads a run back from Kafka for the oracle: read_committed drains, group offsets, and a
                     concurrent read_committed observer
checker.py           `pipeline verify MODULE:ATTR`: drain, then judge (`checker.verify` for tests and tools)
postgres_checker.py  the same judge over the PostgreSQL sink's tables
chaos.py             `pipeline chaos MODULE:ATTR`: one fault run per fault kind, each judged by the oracle
harness.py           real `python -m pipeline run` processes to kill, stop and pause
inputs.py            topics and deterministic input for the examples
"""
