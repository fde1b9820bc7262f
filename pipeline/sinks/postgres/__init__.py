"""The PostgreSQL sink: exactly-once from Kafka into PostgreSQL, with the offsets kept in the database.

runner.py   PostgresRunner: the loop, rebalance callbacks, retries with back-off while PostgreSQL is away
commit.py   `commit_batch`: each partition's batch in one database transaction
task.py     PostgresTask: fence (bump p's epoch) -> restore (offset + state from the tables, in pages) -> batches
            processed in memory
inputs.py   PostgresMultiTask: several co-partitioned inputs and tables merged in timestamp order, every topic's
            offsets row and the order taken written with the batch (docs/inputs.md)
schema.py   the framework's tables (offsets with owner epochs, state, dead letters, merge order), migrations,
            start-up checks
tables.py   how an App's outputs become rows (TableSink); the default writes key/value bytes to `outputs`

Selected with PIPELINE_SINK=postgres and PIPELINE_POSTGRES_DSN; see "PostgreSQL sink" in README.md. The checker of
its tables is pipeline/testing/postgres_checker.py.
"""
