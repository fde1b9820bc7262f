"""Where results go, side by side: `kafka/` (outputs, changelog and offsets in one Kafka transaction) and `postgres/`
(outputs, state and offsets in one PostgreSQL transaction). Each has its runner and its per-partition task, both
built on pipeline/core/; neither imports the other (an import-linter contract keeps it so)."""
