"""Peer benchmarks: the same workload in this template and in other stream processors (see bench.py)."""
