"""Per-token metadata (the step input's ``token_metadata``) reaches a model layer through
``get_forward_context()`` in every executor: in process, in the engine's own process, and on both
ranks of tensor parallelism.

The observer is real: a model plugin, installed as a third party would (a distribution on the
path with a ``kvserve`` entry point, so spawned processes find it too), whose first MLP appends
what the forward context carried to a file named in the checkpoint's config. The metadata's
source is each request's prompt length, so every chunk's values say whose tokens they are.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import pytest

from kvserve import LLM, SamplingParams
from kvserve.config import EngineConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.plugins import get_plugin_manager
from kvserve.testing.hf_models import build_tiny_model

ENGINE = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 64}
NEW_TOKENS = 4
PROMPTS = [list(range(10, 18)), list(range(20, 60))]  # 8 and 40 tokens: their sequences never reach the same length
PARAMS = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)

PLUGIN = """
from kvserve import hookimpl


@hookimpl
def register_models(register):
    register("MetadataProbeForCausalLM", "metadata_probe.model:MetadataProbe")
"""

MODEL = """
import json

from kvserve import distributed
from kvserve.forward_context import get_forward_context
from kvserve_models_llama.model import LlamaForCausalLM


class MetadataProbe(LlamaForCausalLM):
    # Llama whose first MLP appends, per forward, what the forward context carried to hf_config.probe_file.

    def __init__(self, hf_config, quant_method):
        super().__init__(hf_config, quant_method)
        self.probe_file = hf_config.probe_file
        self.model.layers[0].mlp.register_forward_pre_hook(self.record)

    def record(self, module, args):
        ctx = get_forward_context()
        line = {
            "rank": distributed.rank(),
            "tokens": args[0].shape[0],
            "query_start_loc": list(ctx.batch.query_start_loc_host),
            "seq_lens": list(ctx.batch.seq_lens_host),
            "metadata": {name: values.tolist() for name, values in ctx.token_metadata.items()},
        }
        with open(self.probe_file, "a") as out:
            out.write(json.dumps(line) + "\\n")


def prompt_length(request):
    return request.num_prompt_tokens


def add_prompt_length(engine):
    engine.token_metadata["prompt_len"] = prompt_length
"""


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """``(checkpoint, probe file)``: a tiny Llama served by the probe plugin, found on sys.path
    (which spawned processes inherit) through a hand-written distribution."""
    site = tmp_path / "site"
    package = site / "metadata_probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    (package / "model.py").write_text(textwrap.dedent(MODEL))
    dist_info = site / "metadata_probe-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: metadata-probe\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[kvserve]\nmetadata_probe = metadata_probe.plugin\n")
    monkeypatch.syspath_prepend(str(site))
    get_plugin_manager.cache_clear()
    probe_file = tmp_path / "probe.jsonl"
    path = build_tiny_model("llama", tmp_path / "model", probe_file=str(probe_file))
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["MetadataProbeForCausalLM"]  # save_pretrained wrote the HF class's name
    (path / "config.json").write_text(json.dumps(config))
    yield path, probe_file
    monkeypatch.undo()
    get_plugin_manager.cache_clear()


def _records(probe_file: Path) -> list[dict]:
    return [json.loads(line) for line in probe_file.read_text().splitlines()]


def _check(records: list[dict]) -> None:
    """Every forward carried one value per token, each chunk its own request's prompt length."""
    assert records, "the probe layer saw no forward"
    seen = set()
    for record in records:
        starts, seq_lens, values = record["query_start_loc"], record["seq_lens"], record["metadata"]["prompt_len"]
        assert len(values) == record["tokens"]
        for i, seq_len in enumerate(seq_lens):
            chunk = set(values[starts[i] : starts[i + 1]])
            assert len(chunk) == 1, f"chunk {i} carries mixed values {chunk}"
            (value,) = chunk
            assert value <= seq_len < value + NEW_TOKENS, (
                f"a sequence of {seq_len} tokens carries prompt length {value}"
            )
            seen.add(value)
    assert seen == {len(p) for p in PROMPTS}
    # Prefill once and decode the rest, per request.
    assert sum(len(r["seq_lens"]) for r in records) == len(PROMPTS) * NEW_TOKENS


def test_metadata_reaches_a_layer_in_process(probe):
    path, probe_file = probe
    llm = LLM(str(path), **ENGINE)
    llm.engine.token_metadata["prompt_len"] = lambda request: request.num_prompt_tokens
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    records = _records(probe_file)
    _check(records)
    assert records[0]["metadata"]["prompt_len"] == [8] * 8 + [40] * 40  # one prefill step of both


def test_metadata_reaches_a_layer_in_the_engine_process(probe):
    from metadata_probe.model import add_prompt_length  # the engine process imports it too

    path, probe_file = probe
    config = EngineConfig.from_flat(model=str(path), engine_process=True, **ENGINE)
    llm = AsyncLLM.from_config(config, core_setup=add_prompt_length)

    async def generate(i: int) -> None:
        async for _ in llm.generate(PROMPTS[i], PARAMS, f"r{i}"):
            pass

    async def both() -> None:
        await asyncio.gather(generate(0), generate(1))

    try:
        asyncio.run(both())
    finally:
        llm.shutdown()
    _check(_records(probe_file))


def test_metadata_reaches_a_layer_on_every_tensor_parallel_rank(probe):
    path, probe_file = probe
    llm = LLM(str(path), tensor_parallel_size=2, **ENGINE)
    try:
        llm.engine.token_metadata["prompt_len"] = lambda request: request.num_prompt_tokens
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    finally:
        llm.engine.shutdown()
    records = _records(probe_file)
    by_rank = [[{k: v for k, v in r.items() if k != "rank"} for r in records if r["rank"] == rank] for rank in (0, 1)]
    assert by_rank[0] == by_rank[1], "the ranks saw different steps"
    _check(by_rank[0])
