"""Benchmarks (not installed): `python -m tools.bench` (throughput, `--overhead`), `python -m tools.bench.postgres`,
`python -m tools.bench.snapshots`, `python -m tools.bench.peers`,
`python -m tools.bench.latency` (end-to-end latency at a paced load), `python -m tools.bench.timers` (windowed_totals
with 100 k open windows, restore of 1 M pending timers). Commands and results: BENCHMARKS.md."""
