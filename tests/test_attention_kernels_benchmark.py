"""benchmarks/attention_kernels.py on a CPU times the cpu backend (its C++ kernel and its PyTorch
fallback), decode and prefill, and writes JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "attention_kernels.py"


def test_times_the_cpu_backend_on_a_cpu(tmp_path):
    out = tmp_path / "kernels.json"
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--iters", "1", "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    assert results["platform"] == "cpu"
    rows = results["rows"]
    assert {(row["backend"], row["kernel"], row["phase"]) for row in rows} == {
        ("cpu", kernel, phase) for kernel in ("native", "pytorch") for phase in ("decode", "prefill")
    }
    assert all(row["forward_ms"] > 0 and row["forward_cpu_ms"] >= 0 and row["metadata_ms"] >= 0 for row in rows)
    assert "cpu native   decode" in proc.stdout and "cpu pytorch  prefill" in proc.stdout
