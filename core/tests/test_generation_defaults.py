"""Requests' sampling defaults from a model's generation_config.json (``generation_config``,
``override_generation_config``), read from real files as transformers writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.config import EngineConfig
from kvserve.config_sources import load_config
from kvserve.engine.generation_defaults import default_sampling_fields, describe_defaults
from kvserve.errors import ConfigError


def _folder(tmp_path: Path, name: str, **fields: object) -> Path:
    """A folder holding a generation_config.json as model makers ship it."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, **fields}))
    return folder


def _defaults(model_path: Path, **config: object) -> dict[str, object]:
    return default_sampling_fields(EngineConfig.from_flat(**config).model, str(model_path))


def test_the_models_sampling_fields_become_defaults_under_sampling_params_names(tmp_path: Path) -> None:
    model = _folder(
        tmp_path, "model", do_sample=True, temperature=0.6, top_p=0.9, top_k=20, min_p=0.05,
        repetition_penalty=1.1, max_new_tokens=256, num_beams=1,
    )  # fmt: skip
    expected = {
        "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "max_tokens": 256,
    }  # fmt: skip
    assert _defaults(model) == expected  # auto; EOS, do_sample and num_beams are no sampling defaults
    assert _defaults(model, generation_config="vllm") == {}
    lone = _folder(tmp_path, "lone", temperature=0.3)
    assert _defaults(model, generation_config=str(lone)) == {"temperature": 0.3}  # the named folder, not the model's
    merged = _defaults(model, override_generation_config='{"temperature": 0.2, "max_new_tokens": 8}')
    assert merged == {**expected, "temperature": 0.2, "max_tokens": 8}
    assert _defaults(model, generation_config="vllm", override_generation_config={"top_k": 5}) == {"top_k": 5}


def test_a_model_without_sampling_fields_or_a_gguf_file_has_none(tmp_path: Path) -> None:
    assert _defaults(_folder(tmp_path, "eos-only")) == {}
    assert _defaults(tmp_path / "empty-dir-without-a-file") == {}
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")
    assert _defaults(gguf) == {}


def test_bad_settings_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.generation_config: .*has none"):
        EngineConfig.from_flat(generation_config=str(tmp_path))
    with pytest.raises(ConfigError, match=r"override_generation_config: .*unknown keys \['do_sample'\]"):
        EngineConfig.from_flat(override_generation_config={"do_sample": True})
    with pytest.raises(ConfigError, match="override_generation_config: .*not JSON"):
        load_config(environ={"KVSERVE_OVERRIDE_GENERATION_CONFIG": "{temperature: 1"})
    with pytest.raises(ConfigError, match=r"override_generation_config: .*temperature"):
        _defaults(tmp_path, override_generation_config={"temperature": -1.0})
    hot = _folder(tmp_path, "hot", top_p=1.5)
    with pytest.raises(ConfigError, match=r"^generation_config: .*top_p"):
        _defaults(hot)


def test_every_config_source_sets_them(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "gen", temperature=0.3)
    config_file = tmp_path / "kvserve.yaml"
    config_file.write_text(f"model:\n  generation_config: {folder}\n  override_generation_config:\n    top_k: 3\n")
    assert load_config(config_file, environ={}).model.override_generation_config == {"top_k": 3}
    env = {"KVSERVE_GENERATION_CONFIG": "vllm", "KVSERVE_OVERRIDE_GENERATION_CONFIG": '{"min_p": 0.1}'}
    from_env = load_config(config_file, environ=env).model
    assert (from_env.generation_config, from_env.override_generation_config) == ("vllm", {"min_p": 0.1})


def test_the_start_up_line_says_what_applies_and_from_where(tmp_path: Path) -> None:
    model = _folder(tmp_path, "model", temperature=0.6)
    config = EngineConfig.from_flat(override_generation_config={"top_k": 4}).model
    line = describe_defaults(default_sampling_fields(config, str(model)), config, str(model))
    assert "overridden by the model's Hugging Face generation config" in line and "override_generation_config" in line
    assert "'temperature': 0.6" in line and "'top_k': 4" in line
    config = EngineConfig.from_flat(generation_config="vllm").model
    assert "generation_config='vllm'" in describe_defaults({}, config, str(model))
