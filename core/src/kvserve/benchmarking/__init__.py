"""Benchmark building blocks shared by ``kvserve bench`` and ``benchmarks/``: workloads, offline runs,
the serving load generator and the HF transformers baseline."""
