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


def test_lookahead_times_decodes_beside_their_one_plus_k_steps(tmp_path):
    """``--lookahead`` follows each decode case with 1 + k query tokens over the same contexts, each
    with its time over the decode's; ``--contexts``, ``--heads`` and ``--decodes-only`` shape the cases."""
    out = tmp_path / "lookahead.json"
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    args = ["--iters", "1", "--decodes-only", "--contexts", "40,70", "--lookahead", "1,3", "--heads", "4,2,64"]
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    assert results["heads"] == [4, 2, 64]
    native = [row for row in results["rows"] if row["kernel"] == "native"]
    assert [(row["phase"], row["cached_tokens"], row["new_tokens"]) for row in native] == [
        (phase, cached, new)
        for cached in (40, 70)
        for phase, new in (("decode", 1), ("lookahead", 2), ("lookahead", 4))
    ]
    for row in results["rows"]:
        assert ("vs_decode" in row) == (row["phase"] == "lookahead"), row
    assert all(row["vs_decode"] > 0 for row in results["rows"] if row["phase"] == "lookahead")
    assert "x decode" in proc.stdout


def test_lookahead_refuses_a_k_below_one():
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--lookahead", "0"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "--lookahead: each k is at least 1" in proc.stderr, proc.stderr
