"""Kafka plumbing shared by the runtime: client configurations, topic checks, and reading partitions to their end."""
