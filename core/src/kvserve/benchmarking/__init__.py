"""What ``kvserve bench`` measures with, shared with ``benchmarks/``: workloads, offline runs, the serving
load generator and percentiles. Helpers only the benchmark scripts use live in ``benchmarks/harness``."""
