"""Helpers only the benchmark scripts use (CPU accounting from /proc, the peers' environment, the HF
transformers baseline); what ``kvserve bench`` needs stays in ``kvserve.benchmarking``.

The scripts run as ``python benchmarks/<name>.py``, which puts this folder first on ``sys.path``:
they import ``harness.<module>``; the tests find it through pytest's ``pythonpath``."""
