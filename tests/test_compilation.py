"""Optimization levels: bucket-padded steps into persistent buffers, the compiled forward's greedy
tokens identical to HF transformers in fp32 on the CPU platform's packed weights, and the start-up
line / bench saying how steps ran."""

import time

import pytest
import torch
import transformers
from typer.testing import CliRunner

from kvserve import LLM, SamplingParams
from kvserve.cli import app, bench  # noqa: F401  (registers the commands)
from kvserve.config import EngineConfig
from kvserve.errors import ConfigError
from kvserve.layers import LinearBase, PackedLinearMethod
from kvserve.runner.compilation import token_buckets
from kvserve.runner.step_input import StepInput
from kvserve.testing.hf_models import build_tiny_model
from kvserve_attention_cpu import native_kernel
from kvserve_platform_cpu.platform import CpuPlatform

# The op each kernel of the CPU platform calls from compiled graphs (on the float32 these tests use).
KERNEL_OPS = {
    "avx512": "torch.ops.kvserve_cpu_linear.linear.default(",
    "avx512+amx": "torch.ops.kvserve_cpu_linear.linear.default(",
    "avx2": "torch.ops.kvserve_cpu_linear.linear.default(",
    "onednn": "torch.ops.kvserve_cpu.onednn_linear.default(",
}

PROMPTS = ["Paris is the capital of", "0123456789", "Paged attention stores keys and values"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    # Two layers: compile time grows with the graph, and two already repeat the layer pattern.
    return build_tiny_model("llama", tmp_path_factory.mktemp("compiled-llama"), num_hidden_layers=2)


def hf_greedy_no_eos(path, prompt_ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    outputs = []
    for ids in prompt_ids:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0
            )
        outputs.append(out[0, len(ids) :].tolist())
    return outputs


def test_token_buckets_are_powers_of_two_up_to_the_step_budget():
    assert token_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert token_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert token_buckets(1) == (1,)


def test_optimization_level_is_validated():
    assert EngineConfig.from_flat(optimization_level=2).compilation.optimization_level == 2
    # `--set optimization_level=1` and KVSERVE_OPTIMIZATION_LEVEL arrive as strings
    assert EngineConfig.from_flat(optimization_level="1").compilation.optimization_level == 1
    with pytest.raises(ConfigError, match="compilation.optimization_level"):
        EngineConfig.from_flat(optimization_level=3)
    with pytest.raises(ConfigError, match="optimization_level 1 .* tensor_parallel_size=2"):
        EngineConfig.from_flat(optimization_level=1, tensor_parallel_size=2)


def _first_step(llm: LLM) -> tuple[StepInput, list[list[int]]]:
    """The prompts' first (prefill) step, scheduled on ``llm``'s engine, and the prompts' ids."""
    engine = llm.engine
    tokenizer = llm.get_tokenizer()
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    for i, ids in enumerate(prompt_ids):
        engine.add_request(str(i), engine.check_request(ids, SamplingParams(temperature=0, max_tokens=4)))
    step = StepInput.from_plan(
        engine.scheduler.schedule(), engine.kv_cache_manager, {"request": lambda r: int(r.request_id)}
    )
    return step, prompt_ids


def test_padded_step_lands_in_the_persistent_buffers(tiny_llama):
    # 32 sequences: decode steps reach 32 tokens, so steps up to 32 tokens run compiled, padded.
    llm = LLM(str(tiny_llama), dtype="float32", optimization_level=1, max_num_batched_tokens=32, max_num_seqs=32)
    runner = llm.engine.runner
    step, prompt_ids = _first_step(llm)
    input_ids, positions, batch, metadata = runner.prepare(step)
    real = sum(map(len, prompt_ids))
    assert runner.compiled.buckets == (1, 2, 4, 8, 16, 32) and 16 < real < 32
    assert input_ids.shape[0] == positions.shape[0] == batch.slot_mapping.shape[0] == 32 > real
    assert input_ids.device == runner.device
    assert input_ids[:real].tolist() == [t for ids in prompt_ids for t in ids]
    assert input_ids[real:].eq(0).all() and positions[real:].eq(0).all() and batch.slot_mapping[real:].eq(-1).all()
    owners = [i for i, ids in enumerate(prompt_ids) for _ in ids]
    assert metadata["request"].tolist() == owners + [-1] * (32 - real)  # padded tokens belong to no request
    assert batch.query_start_loc_host[-1] == real and batch.block_tables.is_contiguous()
    # The next step reuses the same storage instead of allocating.
    pointers = (input_ids.data_ptr(), positions.data_ptr(), batch.slot_mapping.data_ptr())
    again, again_pos, again_batch, _ = runner.prepare(step)
    assert (again.data_ptr(), again_pos.data_ptr(), again_batch.slot_mapping.data_ptr()) == pointers


def test_steps_larger_than_a_decode_step_run_eagerly_unpadded(tiny_llama):
    # 2 sequences: decode steps hold at most 2 tokens; the prompts' prefill is larger and runs eagerly.
    llm = LLM(str(tiny_llama), dtype="float32", optimization_level=1, max_num_batched_tokens=32, max_num_seqs=2)
    runner = llm.engine.runner
    step, prompt_ids = _first_step(llm)
    input_ids, _, batch, _ = runner.prepare(step)
    real = sum(map(len, prompt_ids[:2]))  # two of the three prompts fit the batch
    assert runner.compiled.buckets == (1, 2)
    assert input_ids.shape[0] == batch.slot_mapping.shape[0] == real and not runner.compiled.runs(real)
    assert "2 token buckets 1..2 (larger steps eager)" in llm.engine.execution_summary()


@pytest.mark.parametrize("level", [1, 2])
def test_compiled_greedy_tokens_match_hf_in_fp32_on_packed_weights(level, tiny_llama, tmp_path, startup_lines):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_llama)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    expected = hf_greedy_no_eos(tiny_llama, prompt_ids)
    start = time.perf_counter()
    llm = LLM(
        str(tiny_llama), dtype="float32", optimization_level=level, compile_cache_dir=str(tmp_path),
        max_num_batched_tokens=32, max_num_seqs=4,
    )  # fmt: skip
    compiled = llm.engine.runner.compiled
    assert sorted(compiled.compile_seconds) == [1, 2, 4]  # at start-up, before any request
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompt_ids, params, use_tqdm=False)
    log = "\n".join(startup_lines)
    print(f"-O{level}: compiled {sorted(compiled.compile_seconds)} in {time.perf_counter() - start:.1f} s (cold cache)")
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    # No step compiled another graph: the prefill step, larger than any bucket, ran eagerly.
    assert sorted(compiled.compile_seconds) == [1, 2, 4]
    assert f"optimization_level={level} (compiled: inductor" in log
    assert "kvserve compile: 4-token graph" in log
    assert any(tmp_path.rglob("*.py")), "inductor wrote no cache under compile_cache_dir"
    code = "\n".join(path.read_text() for path in tmp_path.rglob("*.py"))
    kernel = CpuPlatform().linear_kernel()
    if kernel is not None:
        # The graphs ran the CPU platform's packed GEMM: every dense layer computes through its
        # kernel on the packed weight, and inductor's generated code calls the kernel's opaque op.
        linears = [m for m in llm.engine.model.modules() if isinstance(m, LinearBase)]
        assert linears and all(
            isinstance(m.quant_method, PackedLinearMethod) and m.quant_method.kernel.name == kernel.name
            for m in linears
        )
        # Where the kernel fuses SiLU, each MLP's gate and up run as one gated call of it instead.
        fused = sum(layer.mlp.gated_kernel is not None for layer in llm.engine.model.model.layers)
        gated = f"; {fused} gated MLPs fused" if fused else ""
        assert f"linear_kernel={kernel.name} ({len(linears)}/{len(linears)} linear layers + lm_head{gated})" in log
        assert code.count(KERNEL_OPS[kernel.name]) == (len(linears) - 2 * fused) * 3  # three graphs
        assert code.count("torch.ops.kvserve_cpu_linear.gated_linear.default(") == fused * 3
    ops = CpuPlatform().layer_ops()
    if ops is not None:
        # Eager steps (the prefill) ran the platform's fused layer ops, the graph core's PyTorch ops.
        assert f"layer_ops={ops.describe()} in eager steps, torch in compiled graphs" in log
        assert "kvserve_cpu_layer_ops" not in code


def test_start_up_line_and_bench_name_level_and_kernels(tiny_llama, startup_lines):
    LLM(str(tiny_llama), dtype="bfloat16", max_num_seqs=4)
    line = next(m for m in startup_lines if m.startswith("kvserve engine:"))
    kernels = "attention_backend=cpu (decode and prefill: C++ paged kernel"
    if native_kernel.unavailable_reason() is not None:  # no compiler here: the PyTorch path, saying why
        kernels = "attention_backend=cpu (PyTorch fallback ("
    assert f"optimization_level=0 (eager) {kernels}" in line
    model = ["--model", str(tiny_llama), "-O", "0", "--set", "max_num_seqs=4", "--set", "dtype=float32"]
    sizes = ["--batch-size", "2", "--input-len", "4", "--output-len", "2", "--num-iters", "1"]
    args = ["bench", "latency", *model, *sizes]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # the console wraps long lines
    assert f"dtype=float32 optimization_level=0 (eager) {kernels}" in output


def test_engines_of_one_model_class_keep_graphs_of_their_own(tmp_path):
    """Two models of one class and shape but other weights, compiled with freezing in one process: each
    engine's graphs hold its own weights (the compiled forward skips dynamo's guards on the model's
    modules, and a frozen graph of the other model would pass every guard left)."""
    models = [build_tiny_model("llama", tmp_path / f"seed{seed}", seed=seed, num_hidden_layers=1) for seed in (1, 2)]
    tokenizer = transformers.AutoTokenizer.from_pretrained(models[0])
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS[:2]]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    engines = [
        LLM(str(m), dtype="float32", optimization_level=2, compile_cache_dir=str(tmp_path / "cache"), max_num_seqs=2)
        for m in models
    ]
    for model, llm in zip(models, engines, strict=True):
        outputs = llm.generate(prompt_ids, params, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy_no_eos(model, prompt_ids)
