"""The packed GGUF path inside a compiled forward (``optimization_level`` 1): the GGML kernel's ops
trace (their fake implementations give the shapes) and nothing of the platform's kernel selection
runs inside the graph."""

from __future__ import annotations

from kvserve import LLM, SamplingParams
from kvserve.layers import LinearBase
from kvserve.loader.default_model import embedded_gguf_path


def test_the_embedded_gguf_decodes_packed_at_a_compiled_level():
    llm = LLM(str(embedded_gguf_path()), dtype="bfloat16", optimization_level=1, max_model_len=128, max_num_seqs=2)
    methods = {type(m.quant_method).__name__ for m in llm.engine.model.modules() if isinstance(m, LinearBase)}
    assert methods == {"GGUFLinearMethod"}
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outputs = llm.generate(["The capital of France is", "Name a color:"], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 6]
    assert outputs[0].outputs[0].text.strip().startswith("Paris")
