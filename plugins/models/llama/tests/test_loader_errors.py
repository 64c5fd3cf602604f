"""``kvserve.loader.open_model`` on HF-format directories: sharded checkpoints and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvserve.loader import ModelLoadError, open_model
from kvserve.testing.hf_models import build_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("tiny"))


def test_sharded_checkpoint_streams_every_shard(tiny_dir, tmp_path):
    state = load_file(tiny_dir / "model.safetensors")
    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_dir, sharded, ignore=shutil.ignore_patterns("model.safetensors"))
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, file_names in halves.items():
        save_file({name: state[name] for name in file_names}, sharded / file, metadata={"format": "pt"})
    weight_map = {name: file for file, file_names in halves.items() for name in file_names}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    weights = dict(open_model(str(sharded)).weights())
    assert sorted(weights) == names
    for name in names:
        torch.testing.assert_close(weights[name], state[name], atol=0, rtol=0)


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        open_model(str(tmp_path / "nowhere"))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        open_model(str(tmp_path))


def test_directory_without_safetensors(tiny_dir, tmp_path):
    copy = tmp_path / "no-weights"
    shutil.copytree(tiny_dir, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    (copy / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weight files \(found pytorch_model.bin"):
        open_model(str(copy))


def test_missing_shard_is_named(tiny_dir, tmp_path):
    copy = tmp_path / "broken-index"
    shutil.copytree(tiny_dir, copy)
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors"):
        open_model(str(copy))


def test_file_that_is_not_gguf(tmp_path):
    file = tmp_path / "model.bin"
    file.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        open_model(str(file))


def test_missing_tokenizer_points_to_the_tokenizer_argument(tiny_dir, tmp_path):
    copy = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_dir, copy, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json"))
    with pytest.raises(ModelLoadError, match="cannot load a tokenizer"):
        open_model(str(copy))
    assert open_model(str(copy), tokenizer=str(tiny_dir)).tokenizer.eos_token == "</s>"
