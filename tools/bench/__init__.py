"""Benchmarks (not installed): `python -m tools.bench` (throughput, `--overhead`), `python -m tools.bench.postgres`,
`python -m tools.bench.snapshots`, `python -m tools.bench.peers`. Commands and results: BENCHMARKS.md."""
