"""``LLM`` without sampling params samples with the model's generation_config.json defaults
(``LLM.get_default_sampling_params``, as vLLM's); given params are used as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvserve import LLM, SamplingParams
from kvserve.testing.hf_models import build_tiny_model

MODEL_DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_tiny_model("llama", tmp_path_factory.mktemp("sampling-llama"))
    (path / "generation_config.json").write_text(json.dumps({"do_sample": True, "eos_token_id": 2, **MODEL_DEFAULTS}))
    return path


def _recorded_params(llm: LLM) -> list[SamplingParams]:
    """The SamplingParams of every request ``llm``'s engine is given from now on."""
    seen: list[SamplingParams] = []
    add_request = llm.engine.add_request

    def recording_add_request(request_id: str, request: Any) -> None:
        seen.append(request.params)
        add_request(request_id, request)

    llm.engine.add_request = recording_add_request
    return seen


def test_generate_and_chat_without_params_sample_with_the_models_defaults(model_dir: Path, startup_lines) -> None:
    llm = LLM(str(model_dir), dtype="float32")
    assert any("overridden by the model's Hugging Face generation config" in line for line in startup_lines)
    defaults = llm.get_default_sampling_params()
    assert {name: getattr(defaults, name) for name in MODEL_DEFAULTS} == MODEL_DEFAULTS
    assert defaults.max_tokens == SamplingParams().max_tokens  # the file sets no max_new_tokens
    seen = _recorded_params(llm)
    llm.generate(["hello"], use_tqdm=False)
    llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert [(p.temperature, p.top_p, p.top_k, p.repetition_penalty) for p in seen] == [
        tuple(MODEL_DEFAULTS.values()),
        (0.0, 1.0, 0, 1.0),  # given params are the request's whole choice, as in vLLM
    ]


def test_vllm_and_overrides_change_the_offline_defaults(model_dir: Path) -> None:
    neutral = LLM(str(model_dir), dtype="float32", generation_config="vllm").get_default_sampling_params()
    assert neutral == SamplingParams()
    overridden = LLM(str(model_dir), dtype="float32", override_generation_config={"top_k": 3, "max_new_tokens": 5})
    params = overridden.get_default_sampling_params()
    assert (params.temperature, params.top_k, params.max_tokens) == (0.7, 3, 5)
