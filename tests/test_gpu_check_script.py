"""scripts/gpu-check on a machine without CUDA, and the pieces of it that run anywhere."""

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu-check"


def load_script():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_check", loader))
    loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_exits_3_without_a_traceback(tmp_path):
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert "no CUDA device" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    assert not any(tmp_path.iterdir()), "nothing is installed or written without a device"


def test_generated_contract_module_runs_what_is_installed_and_names_what_is_not(tmp_path):
    """The module the script generates runs a real contract (the CPU backend's, here) and turns a
    component that is not installed into a skip naming why; junit_counts reads both back."""
    script = load_script()
    module = tmp_path / "test_gpu_contracts.py"
    targets = [("attention_backend", "cpu"), ("attention_backend", "no_such_backend")]
    module.write_text(script.CONTRACTS_MODULE.replace("__TARGETS__", repr(targets)))
    junit = tmp_path / "contracts.xml"
    run = script.Run(tmp_path, budget=300)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={tmp_path}",
               "-k", "unsupported_reasons or installed", f"--junitxml={junit}", str(module)]  # fmt: skip
    step = run.step("contracts", command, 300, junit)
    assert step["status"] == "passed" and run.ok, step["output_tail"]
    counts = step["tests"]
    assert counts["TestAttentionBackend_cpu"]["passed"] == 1
    missing = counts["Test_attention_backend_no_such_backend"]
    assert missing["skipped"] == 1 and "unknown attention backend 'no_such_backend'" in missing["notes"][0]
    text = script.summary("a test device", run)
    assert "ALL PASSED" in text and "TestAttentionBackend_cpu" in text and "no_such_backend" in text


def test_generated_platform_contract_checks_the_lora_kernel_in_float16_too(tmp_path):
    """The platform contract the script generates checks the LoRA kernel in bfloat16, float16 and
    float32 (the CPU platform's, here: the dtypes it does not run are skipped, saying so)."""
    script = load_script()
    module = tmp_path / "test_gpu_contracts.py"
    module.write_text(script.CONTRACTS_MODULE.replace("__TARGETS__", repr([("platform", "cpu")])))
    junit = tmp_path / "contracts.xml"
    run = script.Run(tmp_path, budget=300)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={tmp_path}",
               "-k", "lora_kernel_matches", f"--junitxml={junit}", str(module)]  # fmt: skip
    step = run.step("contracts", command, 300, junit)
    assert step["status"] == "passed", step["output_tail"]
    counts = step["tests"]["TestPlatform_cpu"]
    assert counts["failed"] == 0 and counts["passed"] + counts["skipped"] == 3 * 4, counts  # 3 dtypes x 4 seeds
    assert counts["passed"] >= 2 * 4, counts  # float32 and bfloat16 run on the CPU


def test_summary_gives_each_backends_lookahead_step_against_its_decode(tmp_path):
    """The benchmark step runs with ``--lookahead``; the summary lists each backend's 1 + k step
    with its ratio to the decode, and leaves out rows without one (decodes, skipped backends)."""
    script = load_script()
    bench = {
        "rows": [
            {"backend": "flash_attn", "phase": "decode", "sequences": 64, "cached_tokens": 2048, "new_tokens": 1,
             "forward_ms": 0.5},
            {"backend": "flash_attn", "phase": "lookahead", "sequences": 64, "cached_tokens": 2048,
             "new_tokens": 1 + script.LOOKAHEAD, "forward_ms": 0.6, "vs_decode": 1.2},
            {"backend": "flashinfer", "skipped": "no flashinfer"},
        ]
    }  # fmt: skip
    text = script.summary("a test device", script.Run(tmp_path, budget=1), bench)
    assert f"(1 + {script.LOOKAHEAD} query tokens) vs a decode" in text
    (line,) = [line for line in text.splitlines() if "the decode" in line]
    assert "flash_attn" in line and "64 x (2048 cached + 4 new)" in line and "1.20x the decode" in line
    assert "--lookahead" in script.__doc__
