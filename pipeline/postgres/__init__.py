"""The PostgreSQL sink: exactly-once from Kafka into PostgreSQL, with the offsets kept in the database.

    schema.py   the framework's tables (offsets with owner epochs, state, dead letters), migrations, start-up checks
    sink.py     how an App's outputs become rows (TableSink); the default writes key/value bytes to `outputs`
    worker.py   worker(p): fence (bump p's epoch) -> restore (offset + state from the tables) -> batches, each one
                database transaction that first advances p's offset row only if the epoch is still its own
    runner.py   the consumer loop, rebalance callbacks, retries with back-off while PostgreSQL is away
    checker.py  verifies the tables against the input (each input coordinate exactly once, state = offline fold)
    bench.py    rows/s against the Kafka exactly-once mode

Selected with PIPELINE_SINK=postgres and PIPELINE_POSTGRES_DSN; see "PostgreSQL sink" in README.md.
"""
