"""HF-format checkpoint directories: config.json, *.safetensors (optionally sharded) and tokenizer files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig

from kvserve.loader.source import ModelLoadError, ModelSource
from kvserve.loader.tokenizer import load_tokenizer

SHARD_INDEX = "model.safetensors.index.json"


@dataclass
class SafetensorsSource(ModelSource):
    """A checkpoint directory whose weights live in one or more safetensors files."""

    files: list[Path]

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield every tensor of every file; only one tensor is materialised at a time."""
        for file in self.files:
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)


def open_hf_directory(directory: Path, tokenizer: str | None = None) -> SafetensorsSource:
    """Open an HF-format checkpoint directory; ``tokenizer`` overrides where the tokenizer comes from."""
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"{directory} has no config.json: it is not an HF-format model directory")
    files = safetensors_files(directory)
    hf_config = AutoConfig.from_pretrained(directory)
    return SafetensorsSource(
        hf_config=hf_config,
        tokenizer=load_tokenizer(tokenizer or str(directory)),
        path=str(directory),
        files=files,
    )


def safetensors_files(directory: Path) -> list[Path]:
    """The weight files of ``directory``: those its shard index names, else every ``*.safetensors``."""
    index = directory / SHARD_INDEX
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [file.name for file in files if not file.is_file()]
        if missing:
            raise ModelLoadError(f"{index} names shard files that do not exist: {', '.join(missing)}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
        hint = f" (found {', '.join(others)}; only safetensors weights are read)" if others else ""
        raise ModelLoadError(f"{directory} has no *.safetensors weight files{hint}")
    return files
