"""Developer tools that are not installed with the package: the demo and the benchmarks."""
