"""The benchmark helpers the peers comparisons rely on: CPU accounting from /proc, waiting for idle engines, the
engines' environment, the mixed chat workload, the sampling mix and the machine's ISA."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.cpu_usage import CpuWindow, busy_cpu_seconds, tree_cpu_seconds, wait_until_idle
from harness.engine_env import engine_env
from harness.sampling_mix import DEFAULT_SAMPLING_MIX, describe_mode, machine_isa, parse_sampling_mix
from kvserve.benchmarking.workload import mixed_chat_prompt_ids
from kvserve.testing.hf_models import build_tokenizer
from kvserve_cpu_native import cpu_name_and_flags

SPIN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(30)"
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_cpu_window_counts_a_watched_process_tree_as_own():
    # A shell whose child spins for 0.5 CPU seconds: the tree sum must find the grandchild.
    proc = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{SPIN}'; :"])
    try:
        with CpuWindow(proc.pid) as window:
            deadline = time.monotonic() + 20
            while tree_cpu_seconds(proc.pid) < 0.5 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert window.own_s >= 0.45, window.own_s
        assert window.busy_s >= 0.45 and window.wall_s > 0
        assert window.foreign_s == pytest.approx(window.busy_s - window.own_s)
    finally:
        proc.kill()
        proc.wait()
    assert busy_cpu_seconds() > 0
    assert tree_cpu_seconds(2**22 + 1) == 0.0  # no such process


def test_wait_until_idle_returns_once_a_busy_process_goes_quiet():
    busy = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass\ntime.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", busy])
    try:
        deadline = time.monotonic() + 20
        while tree_cpu_seconds(proc.pid) < 0.1 and time.monotonic() < deadline:  # it has started spinning
            time.sleep(0.02)
        waited = wait_until_idle([proc.pid], limit=10)
        # it spun on for most of its second, then slept: quiet before the limit
        assert 0.5 <= waited < 5, waited
        assert wait_until_idle([proc.pid], window=0.1, limit=10) < 0.5  # already quiet: one window
    finally:
        proc.kill()
        proc.wait()


def test_engine_env_runs_another_checkouts_sources_with_their_own_native_folder(tmp_path, monkeypatch):
    for name in ("OMP_NUM_THREADS", "PYTHONPATH", "KVSERVE_NATIVE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    # A checkout's packages: core and one plugin, each a module saying where it was imported from.
    for src in ("core/src/kvserve", "plugins/models/llama/src/kvserve_models_llama"):
        (tmp_path / src).mkdir(parents=True)
        (tmp_path / src / "__init__.py").write_text("CHECKOUT = True\n")
    env = engine_env(str(tmp_path))
    assert env["OMP_NUM_THREADS"] == "2" and env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["KVSERVE_NATIVE_CACHE"] == str(tmp_path / ".kvserve-native")
    probe = "import kvserve, kvserve_models_llama; print(kvserve.CHECKOUT, kvserve_models_llama.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    # the checkout's sources, not the installed (editable) packages, are what the engine imports
    assert out.split() == ["True", str(tmp_path / "plugins/models/llama/src/kvserve_models_llama/__init__.py")]
    own = engine_env()  # this checkout's engines: the environment as it is, threads set
    assert "PYTHONPATH" not in own and "KVSERVE_NATIVE_CACHE" not in own and own["OMP_NUM_THREADS"] == "2"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert engine_env()["OMP_NUM_THREADS"] == "1"


def test_mixed_chat_prompts_are_seeded_and_of_mixed_lengths(tmp_path):
    tokenizer = build_tokenizer(tmp_path)
    tokenizer.chat_template = TEMPLATE
    prompts = mixed_chat_prompt_ids(tokenizer, 16, seed=3)
    assert len(prompts) == 16 and all(isinstance(t, int) for p in prompts for t in p)
    assert max(map(len, prompts)) > 3 * min(map(len, prompts))  # earlier turns make some much longer
    assert mixed_chat_prompt_ids(tokenizer, 16, seed=3) == prompts
    assert mixed_chat_prompt_ids(tokenizer, 16, seed=4) != prompts
    assert tokenizer.decode(prompts[0]).endswith("<user>Write a short poem about the ocean.\n<assistant>")


def test_sampling_mix_names_its_modes_and_refuses_unknown_ones():
    modes = parse_sampling_mix("t07p09, greedy,t07p09")
    assert modes == {"t07p09": {"temperature": 0.7, "top_p": 0.9}, "greedy": {"temperature": 0.0, "top_p": 1.0}}
    assert parse_sampling_mix(DEFAULT_SAMPLING_MIX).keys() == {"greedy", "t1", "t07p09"}
    assert [describe_mode(m) for m in ("greedy", "t1", "t07p09")] == [
        "greedy (temperature=0)", "t1 (temperature=1)", "t07p09 (temperature=0.7, top_p=0.9)",
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"unknown modes \['t2'\]; choose from greedy, t1, t07p09"):
        parse_sampling_mix("greedy,t2")


def test_machine_isa_names_the_widest_matmul_extension():
    name, flags = cpu_name_and_flags()
    isa = machine_isa()
    assert isa.startswith(name)
    if "amx_bf16" in flags:
        assert "AMX" in isa
    elif "avx512f" in flags:
        assert "AVX-512" in isa and "no AMX" in isa and ("BF16" in isa) == ("avx512_bf16" in flags)
    elif "avx2" in flags:
        assert "AVX2, no AVX-512" in isa


def test_llama_batched_bench_table_is_read_by_column():
    """llama.cpp's ``llama-batched-bench`` table (this text is its output on the embedded SmolLM2, one
    thread), read by column name: the header and the rule are skipped, every number is kept."""
    from gguf_packed import batched_bench_rows

    printed = """
llama_batched_bench: n_kv_max = 512, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|     8 |      4 |    1 |     12 |    0.038 |   210.83 |    0.026 |   151.20 |    0.064 |   186.34 |
|     8 |      4 |    2 |     24 |    0.078 |   204.80 |    0.069 |   116.09 |    0.147 |   163.22 |
"""
    rows = batched_bench_rows(printed)
    assert [(row["B"], row["S_TG t/s"], row["T s"]) for row in rows] == [(1, 151.20, 0.064), (2, 116.09, 0.147)]
    with pytest.raises(SystemExit, match="no table"):
        batched_bench_rows("error: failed to load model")
