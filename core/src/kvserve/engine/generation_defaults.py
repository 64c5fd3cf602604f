"""Requests' default sampling parameters from the model's ``generation_config.json``, as vLLM's
``--generation-config`` (``ModelConfig.get_diff_sampling_param``).

Model makers ship the sampling they recommend there (Llama 3: ``temperature=0.6, top_p=0.9``;
Qwen3: ``top_k=20`` too). A request that leaves a field unset gets the model's value; one that
sets it keeps its own. ``generation_config="vllm"`` ignores the file: kvserve's neutral defaults
(``temperature=1.0``, no top-p/top-k/min-p, no repetition penalty).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvserve.config import AUTO, GENERATION_CONFIG_FIELDS, NO_GENERATION_CONFIG, ModelConfig
from kvserve.errors import ConfigError
from kvserve.sampling_params import SamplingParams

FILE_NAME = "generation_config.json"


def generation_config_folder(model: ModelConfig, model_path: str) -> Path | None:
    """The folder whose ``generation_config.json`` is read: the model's directory (``auto`` or
    ``vllm``, which still reads EOS there), or the folder ``generation_config`` names. None for a
    model that is one file (a GGUF: its metadata holds no sampling defaults)."""
    if model.generation_config not in (AUTO, NO_GENERATION_CONFIG):
        return Path(model.generation_config)  # the config checked that it holds the file
    return Path(model_path) if Path(model_path).is_dir() else None


def read_generation_config(folder: Path | None) -> dict[str, Any]:
    """The fields ``folder``'s ``generation_config.json`` sets (as transformers'
    ``GenerationConfig.to_diff_dict``); empty without one."""
    if folder is None or not (folder / FILE_NAME).is_file():
        return {}
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(folder).to_diff_dict()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"generation_config: {folder / FILE_NAME} cannot be read: {exc}") from None


def default_sampling_fields(model: ModelConfig, model_path: str) -> dict[str, Any]:
    """The SamplingParams fields a request gets when it leaves them unset: the generation config's
    (none with ``vllm``) with ``override_generation_config`` merged over them, under SamplingParams'
    names (HF's ``max_new_tokens`` is ``max_tokens``). ConfigError naming the source for a value
    SamplingParams refuses (a negative temperature, a top_p above 1, ...)."""
    source: dict[str, Any] = {}
    if model.generation_config != NO_GENERATION_CONFIG:
        source = read_generation_config(generation_config_folder(model, model_path))
    source.update(model.override_generation_config)
    fields = {
        ("max_tokens" if name == "max_new_tokens" else name): source[name]
        for name in GENERATION_CONFIG_FIELDS
        if source.get(name) is not None
    }
    try:
        SamplingParams(**fields)
    except ValidationError as exc:
        where = "override_generation_config" if model.override_generation_config else "generation_config"
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: sampling defaults {fields} are not valid: {problems}") from None
    return fields


def describe_defaults(fields: dict[str, Any], model: ModelConfig, model_path: str) -> str:
    """One start-up line saying which sampling defaults requests get and where they come from."""
    ignored = model.generation_config == NO_GENERATION_CONFIG
    if not fields:
        why = "generation_config='vllm'" if ignored else "the model's generation config sets none"
        return f"Default sampling parameters: SamplingParams' own ({why})"
    folder = None if ignored else generation_config_folder(model, model_path)
    has_file = folder is not None and (folder / FILE_NAME).is_file()
    origins = [f"the model's Hugging Face generation config ({folder / FILE_NAME})"] if has_file else []
    if model.override_generation_config:
        origins.append("override_generation_config")
    return (
        f"Default sampling parameters have been overridden by {' and '.join(origins)}: {fields}; a request's "
        "own values win (generation_config='vllm' ignores the model's)"
    )
