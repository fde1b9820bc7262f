"""Exactly-once read-process-write on Apache Kafka."""
