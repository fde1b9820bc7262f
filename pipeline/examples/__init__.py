"""Example services used by the tests, the demo and the benchmarks."""
