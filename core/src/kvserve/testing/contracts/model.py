"""The Model contract: a checkpoint built by transformers loads and gives transformers' logits."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from kvserve.errors import WeightLoadError
from kvserve.interfaces import Model
from kvserve.layers import LinearBase, UnquantizedLinearMethod
from kvserve.runner.build import default_dtype  # build as the runner builds
from kvserve.testing.contracts._base import ComponentContract, violation
from kvserve.testing.hf_models import build_tiny_model
from kvserve.testing.paged_model import PagedSequences


class _RecordingLinearMethod(UnquantizedLinearMethod):
    """Dense weights, counting how often the model goes through the quantization method."""

    def __init__(self, quant_config: dict[str, Any] | None = None) -> None:
        super().__init__(quant_config)
        self.created = 0
        self.applied = 0

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix):
        self.created += 1
        super().create_weights(layer, input_size, output_sizes, params_dtype, prefix)

    def apply(self, layer, x, bias):
        self.applied += 1
        return super().apply(layer, x, bias)


class ModelContract(ComponentContract):
    """Every model plugin must pass this, for each architecture it registers::

        class TestMyModel(ModelContract):
            architecture = "MyLlamaForCausalLM"        # the registered HF architectures name
            reference_architecture = "LlamaForCausalLM"  # transformers class to compare with
            config_variants = {"gqa": {}, "mha": {"num_key_value_heads": 4}}

    For each config variant, a tiny random checkpoint (config.json, safetensors, tokenizer; norm
    weights and biases random too) is saved with transformers' :attr:`reference_architecture`
    (default: :attr:`architecture` itself), its ``architectures`` set to :attr:`architecture`,
    then opened with ``kvserve.loader.open_model`` and built as the engine builds a model.
    Checked:

    - the class follows the :class:`~kvserve.interfaces.Model` interface and ``attention_shape``
      matches the config (layers, heads, KV heads, head size);
    - float32 logits equal transformers' within :attr:`atol` for a mixed first step (two whole
      prompts and the first chunk of a third), then a step mixing decodes with the rest of the
      chunked prompt, then decode steps, all through the paged KV cache on randomly permuted
      blocks (the attention is kvserve.testing's float64 reference backend, so only the model
      is under test);
    - in bfloat16 (built under that default dtype, bfloat16 KV cache) the logits stay within
      :attr:`bfloat16_tolerance` (relative) of transformers' float32 logits;
    - ``load_weights`` raises a KeyError naming a checkpoint tensor it has no place for;
    - every linear layer is created and applied through the quantization method it is given
      (or quantized checkpoints could not work).
    """

    kind = "model"
    interface = torch.nn.Module
    named = False
    architecture: ClassVar[str]
    """The registered name: an HF ``architectures`` entry."""
    reference_architecture: ClassVar[str | None] = None
    """transformers model type or class whose output is the reference (default: :attr:`architecture`)."""
    config_variants: ClassVar[dict[str, dict[str, Any]]] = {"default": {}}
    """Name -> tiny config overrides (e.g. ``{"num_key_value_heads": 4}``); each is tested."""
    atol: ClassVar[float] = 1e-4
    bfloat16_tolerance: ClassVar[float] = 0.05
    prompt_lens: ClassVar[tuple[int, int, int]] = (7, 13, 3)
    chunk: ClassVar[int] = 8
    """The second prompt is prefilled in two chunks: this many tokens, then the rest beside decodes."""
    decode_steps: ClassVar[int] = 4

    # -- fixtures and helpers --------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        super().pytest_generate_tests(metafunc)
        if "variant" in metafunc.fixturenames:
            metafunc.parametrize("variant", sorted(self.config_variants), scope="class")

    @pytest.fixture(scope="class")
    @classmethod
    def checkpoint(cls, variant: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
        """``(HF directory, transformers model in float32)`` of the variant."""
        import transformers

        reference = cls.reference_architecture or cls.architecture
        path = tmp_path_factory.mktemp(f"{cls.__name__}-{variant}")
        try:
            build_tiny_model(
                reference,
                path,
                randomize_vectors=True,
                registered_as=cls.component_name(),
                **cls.config_variants[variant],
            )
        except ValueError as exc:
            pytest.skip(f"no transformers reference for {cls.component_name()!r} ({exc}); set reference_architecture")
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return path, hf_model

    def load(self, component: type, path: Path, dtype: torch.dtype = torch.float32, quant_method=None):
        """Build and load the model as the engine does (default dtype set, linear layers post-processed)."""
        from kvserve.loader import open_model

        source = open_model(str(path))
        with default_dtype(dtype):
            model = component(source.hf_config, quant_method or UnquantizedLinearMethod())
        model.load_weights(source.weights())
        for module in model.modules():
            if isinstance(module, LinearBase):
                module.quant_method.process_weights_after_loading(module)
        return model.eval()

    def sequences(self, vocab: int) -> list[list[int]]:
        """Token ids of each sequence: prompt then the tokens fed in the decode steps."""
        gen = torch.Generator().manual_seed(2)
        return [torch.randint(3, vocab, (n + self.decode_steps,), generator=gen).tolist() for n in self.prompt_lens]

    def run_steps(self, model, sequences: list[list[int]], dtype: torch.dtype) -> list[list[tuple[str, torch.Tensor]]]:
        """Feed ``sequences`` as the engine would: a mixed prefill step (one prompt chunked), a step
        mixing decodes with the rest of that prompt, then decodes. Per sequence, ``(step kind, logits)``
        for every position in order."""
        runner = PagedSequences(model, len(sequences), dtype=dtype)
        computed: list[list[tuple[str, torch.Tensor]]] = [[] for _ in sequences]
        first, chunked, last = (seq[:n] for seq, n in zip(sequences, self.prompt_lens))
        steps = [
            ("prefill", {0: first, 1: chunked[: self.chunk], 2: last}),
            ("decode or chunked prefill", {0: [sequences[0][len(first)]], 1: chunked[self.chunk :]}),
        ]
        steps[1][1][2] = [sequences[2][len(last)]]
        for kind, chunks in steps:
            for seq, logits in runner.step(chunks).items():
                computed[seq] += [(kind, row) for row in logits]
        while unfinished := [i for i, seq in enumerate(sequences) if runner.lengths[i] < len(seq)]:
            for seq, logits in runner.step({i: [sequences[i][runner.lengths[i]]] for i in unfinished}).items():
                computed[seq] += [("decode", row) for row in logits]
        return computed

    @staticmethod
    def expected_attention_shape(hf_config: Any) -> tuple[int, int, int, int]:
        """``(layers, heads, KV heads, head size)`` as the HF config states them."""
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        return hf_config.num_hidden_layers, heads, kv_heads, head_dim

    # -- tests -----------------------------------------------------------------------------
    def test_follows_the_model_interface(self, component, checkpoint):
        """An instance has the Model methods, and its ``attention_shape`` matches the config."""
        path, hf_model = checkpoint
        model = self.load(component, path)
        assert isinstance(model, Model), f"{component.__name__} lacks methods of kvserve.interfaces.Model"
        expected = self.expected_attention_shape(hf_model.config)
        assert tuple(model.attention_shape()) == expected, (
            f"attention_shape() is {model.attention_shape()}, the config says "
            f"(num_layers, num_heads, num_kv_heads, head_dim) = {expected}"
        )

    def test_logits_match_transformers(self, component, checkpoint, variant):
        """float32 logits of prefill, chunked prefill and decode steps equal transformers' full forward."""
        path, hf_model = checkpoint
        sequences = self.sequences(hf_model.config.vocab_size)
        with torch.no_grad():
            expected = [hf_model(torch.tensor([seq])).logits[0] for seq in sequences]
        computed = self.run_steps(self.load(component, path), sequences, torch.float32)
        for seq, rows in enumerate(computed):
            assert len(rows) == len(sequences[seq]), (
                f"sequence {seq}: {len(rows)} logits rows for {len(sequences[seq])} tokens"
            )
            for position, (kind, row) in enumerate(rows):
                error = float((row - expected[seq][position]).abs().max())
                if not error <= self.atol:
                    violation(
                        f"variant {variant!r}: logits differ from transformers by {error:.3g} (atol {self.atol}) "
                        f"at position {position} of sequence {seq} (prompt {self.prompt_lens[seq]} tokens), "
                        f"computed in a {kind} step"
                    )

    def test_runs_in_bfloat16(self, component, checkpoint):
        """Built under bfloat16 (as the engine does for ``dtype="bfloat16"``), logits stay close to float32's."""
        path, hf_model = checkpoint
        sequences = self.sequences(hf_model.config.vocab_size)
        with torch.no_grad():
            expected = torch.cat([hf_model(torch.tensor([seq])).logits[0] for seq in sequences])
        computed = self.run_steps(self.load(component, path, torch.bfloat16), sequences, torch.bfloat16)
        logits = torch.stack([row for rows in computed for _, row in rows])
        error = float((logits.double() - expected.double()).norm() / expected.double().norm())
        assert error <= self.bfloat16_tolerance, (
            f"bfloat16 logits differ from transformers' float32 logits by {error:.3g} (relative), "
            f"over {self.bfloat16_tolerance}"
        )

    def test_load_weights_names_an_unknown_tensor(self, component, checkpoint):
        """A checkpoint tensor with no place in the model is a ``WeightLoadError`` that names it."""
        from kvserve.loader import open_model

        path, _ = checkpoint
        source = open_model(str(path))
        model = component(source.hf_config, UnquantizedLinearMethod())
        stray = "model.layers.0.kvserve_contract_stray.weight"
        with pytest.raises(WeightLoadError, match=stray):
            model.load_weights(itertools.chain(source.weights(), [(stray, torch.ones(1))]))

    def test_linear_layers_go_through_the_quantization_method(self, component, checkpoint):
        """Every linear layer's weight is created and applied by the quantization method given to
        the constructor (``kvserve.layers`` linear layers), so quantized checkpoints load and run."""
        path, hf_model = checkpoint
        method = _RecordingLinearMethod()
        model = self.load(component, path, quant_method=method)
        assert method.created >= hf_model.config.num_hidden_layers, (
            f"only {method.created} linear layers were created through the quantization method for "
            f"{hf_model.config.num_hidden_layers} decoder layers: use kvserve.layers' linear layers"
        )
        PagedSequences(model, 1).step({0: [3, 4, 5]})
        assert method.applied >= method.created, (
            f"{method.created} layers were created through the quantization method but it applied "
            f"only {method.applied} times in a forward pass"
        )
