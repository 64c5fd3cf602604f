"""The QuantizationMethod contract: layers load the checkpoint's tensors and compute what they encode."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from kvserve.forward_context import ForwardContext, current_forward_context
from kvserve.interfaces import Platform, QuantizationMethod
from kvserve.layers import ColumnLinear, MergedColumnLinear, load_checkpoint
from kvserve.lora.layers import LORA_SLOT, LoRASlots, SlotLoad
from kvserve.lora.torch_kernel import TorchLoRAKernel
from kvserve.plugins import get_plugin_manager, load_component
from kvserve.runner.build import default_dtype  # build as the runner builds
from kvserve.testing.contracts._base import ComponentContract


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """``||got - expected|| / ||expected||`` in float64."""
    got, expected = got.double(), expected.double()
    return float((got - expected).norm() / expected.norm())


class QuantizationMethodContract(ComponentContract):
    """Every quantization method plugin must pass this. Subclass it, name the method, and say
    how its checkpoint tensors encode a weight::

        class TestMyQuant(QuantizationMethodContract):
            quantization = "my_quant"          # the quant_method name
            quant_config = {"bits": 8}          # the checkpoint's quantization_config
            max_error = 0.02                    # accuracy bound against the float weight

            def quantize(self, weight):         # float [out, in] -> checkpoint tensors
                ...
            def dequantize(self, tensors):      # checkpoint tensors -> float [out, in]
                ...

    ``quantize`` and ``dequantize`` are the test's plain reference of the format (the defaults
    describe dense weights). A layer is built as the engine builds it: ``ColumnLinear(in, out,
    bias, method, prefix)`` under the model's default dtype; the checkpoint tensors are loaded
    by name through ``kvserve.layers.load_checkpoint`` (as a model's ``load_weights`` does),
    ``process_weights_after_loading`` runs and the layer is offered the platform's
    ``LinearKernel`` (``use_linear_kernel``). Tests run on the first available platform; a
    dtype the method refuses there (``unsupported_reasons``) is skipped with its reasons.
    Checked:

    - ``create_weights`` registers exactly the tensors the checkpoint holds, with their shapes
      (one-element scales may be ``[]`` or ``[1]``) and dtypes (a bias as ``bias`` when the
      layer has one);
    - ``apply`` equals ``x @ dequantize(checkpoint).T + bias`` within :attr:`reference_tolerance`
      (relative error), for leading dimensions ``[n]`` and ``[b, n]``, in every dtype of
      :attr:`dtypes` (default: the method's ``activation_dtypes``), returning the input's dtype;
    - a fused layer (``MergedColumnLinear``, as q/k/v) loads each shard's tensors from a
      safetensors file and equals the stacked dequantized shards (within
      :attr:`fused_tolerance` more, for formats that requantize fused shards to one scale);
    - the resident bytes after loading stay within :attr:`max_resident_ratio` of the checkpoint's;
    - against the original float weight the error stays within :attr:`max_error` (the method's
      accuracy, which the quantize/dequantize pair defines);
    - one method instance serves many layers without mixing up their weights;
    - with LoRA slots beside the layer (``kvserve.lora.layers.LoRASlots``, as ``enable_lora`` gives
      every linear layer), an adapter's shapes are checked against the checkpoint's (unpacked)
      features, its tokens get ``apply``'s output plus ``(x A) B`` (within
      :attr:`reference_tolerance`) and the base tokens beside them exactly ``apply``'s output.
    """

    kind = "quantization_method"
    interface = QuantizationMethod
    quantization: ClassVar[str]
    """Registry name (the ``quant_method`` of HF ``quantization_config``)."""
    quant_config: ClassVar[dict[str, Any] | None] = None
    """The checkpoint's ``quantization_config`` the method is constructed with."""
    shapes: ClassVar[tuple[tuple[int, int], ...]] = ((64, 48), (256, 96))
    """``(in_features, out_features)`` of the layers tested (fit them to the format's group size)."""
    dtypes: ClassVar[tuple[str, ...] | None] = None
    """Activation dtypes tested; None: the method's ``activation_dtypes``."""
    reference_tolerance: ClassVar[dict[str, float]] = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}
    """Relative error allowed against the dequantized reference, per activation dtype."""
    fused_tolerance: ClassVar[float] = 0.0
    """Extra relative error allowed in a fused layer (shards requantized to one scale)."""
    max_error: ClassVar[float] = 0.05
    """Relative error allowed against the float weight (beyond the dtype's reference tolerance)."""
    max_resident_ratio: ClassVar[float] = 1.1
    """Resident parameter bytes after loading, at most this times the checkpoint tensors' bytes."""

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The checkpoint tensors (HF names, without the layer prefix) encoding ``weight`` ``[out, in]``."""
        return {"weight": weight}

    def dequantize(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """The float32 weight ``[out, in]`` that checkpoint ``tensors`` encode."""
        return tensors["weight"].float()

    # -- helpers ---------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        super().pytest_generate_tests(metafunc)
        if "shape" in metafunc.fixturenames:
            metafunc.parametrize("shape", self.shapes, ids=lambda s: f"{s[0]}x{s[1]}")
        if "dtype" in metafunc.fixturenames:
            dtypes = self.dtypes
            if dtypes is None:
                try:
                    dtypes = self.load_component().activation_dtypes
                except Exception:  # the component test reports the load failure itself
                    dtypes = ("float32",)
            metafunc.parametrize("dtype", dtypes)

    @pytest.fixture(scope="class")
    @classmethod
    def platform(cls) -> Platform:
        """The first installed platform available in this process (the one the engine would pick)."""
        tried = []
        for name in get_plugin_manager().registry("platform").names():
            platform_cls = load_component("platform", name)
            reason = platform_cls.unavailable_reason()
            if reason is None:
                return platform_cls()
            tried.append(f"{name}: {reason}")
        pytest.skip(f"no available platform ({'; '.join(tried) or 'none installed'})")

    def require_supported(self, method: QuantizationMethod, platform: Platform, dtype: str) -> None:
        """Skip the test, with the method's reasons, if it refuses ``dtype`` on ``platform``."""
        reasons = method.unsupported_reasons(platform, getattr(torch, dtype))
        if reasons:
            pytest.skip(f"{self.quantization} on {platform.name} with {dtype}: {'; '.join(reasons)}")

    def checkpoint(self, in_features: int, out_features: int, bias: bool, seed: int) -> dict[str, torch.Tensor]:
        """Checkpoint tensors of a random layer (weights of a realistic scale, outliers included)."""
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(out_features, in_features, generator=gen) * in_features**-0.5
        weight[0, 0] *= 8  # an outlier, as real checkpoints have
        tensors = dict(self.quantize(weight))
        if bias:
            tensors["bias"] = torch.randn(out_features, generator=gen)
        return tensors

    def build_layer(
        self, component: type, method: QuantizationMethod, shape, bias: bool, dtype: str, tensors, platform: Platform
    ):
        """A loaded ColumnLinear named ``layer``, built and post-processed as the engine does."""
        with default_dtype(getattr(torch, dtype)):
            layer = ColumnLinear(shape[0], shape[1], bias, method, "layer")
        holder = torch.nn.Module()
        holder.layer = layer
        load_checkpoint(holder, ((f"layer.{name}", tensor) for name, tensor in tensors.items()))
        self.finish_loading(layer, platform)
        return layer

    @staticmethod
    def finish_loading(layer: torch.nn.Module, platform: Platform) -> None:
        """What the engine runs on a loaded layer: the method's post-processing, then the offer of
        the platform's LinearKernel (``kvserve.layers.pack_linear_weights``)."""
        layer.quant_method.process_weights_after_loading(layer)
        kernel = platform.linear_kernel()
        if kernel is not None:
            layer.quant_method.use_linear_kernel(layer, kernel)

    def reference(self, tensors: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """float64 ``x @ dequantize(tensors).T + bias``."""
        out = x.double() @ self.dequantize(tensors).double().T
        return out + tensors["bias"].double() if "bias" in tensors else out

    # -- tests -----------------------------------------------------------------------------
    @pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
    def test_create_weights_registers_the_checkpoint_tensors(self, component, shape, bias):
        """The layer's parameters are exactly the checkpoint's tensors, with their shapes and dtypes,
        so a model's ``load_weights`` can copy them in by name."""
        tensors = self.checkpoint(*shape, bias, seed=0)
        layer = ColumnLinear(shape[0], shape[1], bias, component(self.quant_config), "layer")
        params = dict(layer.named_parameters(recurse=False))
        assert set(params) == set(tensors), (
            f"create_weights registered parameters {sorted(params)}, the checkpoint holds {sorted(tensors)}"
        )
        for name, tensor in tensors.items():
            param = params[name]
            scalar = param.numel() == tensor.numel() == 1  # a per-tensor scale loads from [] or [1]
            assert (param.shape == tensor.shape or scalar) and param.dtype == tensor.dtype, (
                f"parameter {name!r} is {tuple(param.shape)} {param.dtype}, "
                f"the checkpoint tensor {tuple(tensor.shape)} {tensor.dtype}"
            )

    @pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
    def test_apply_matches_the_dequantized_reference(self, component, platform, shape, bias, dtype):
        """``apply`` computes ``x @ W.T + b`` for the weight the checkpoint encodes, for any leading
        dimensions, in the activations' dtype."""
        method = component(self.quant_config)
        self.require_supported(method, platform, dtype)
        tensors = self.checkpoint(*shape, bias, seed=1)
        layer = self.build_layer(component, method, shape, bias, dtype, tensors, platform)
        tolerance = self.reference_tolerance[dtype]
        for leading in [(5,), (2, 3)]:
            x = torch.randn(*leading, shape[0], generator=torch.Generator().manual_seed(2)).to(getattr(torch, dtype))
            with torch.no_grad():
                y = layer(x)
            assert tuple(y.shape) == (*leading, shape[1]) and y.dtype == x.dtype, (
                f"apply() on {tuple(x.shape)} {x.dtype} returned {tuple(y.shape)} {y.dtype}; "
                f"expected {(*leading, shape[1])} {x.dtype}"
            )
            error = relative_error(y, self.reference(tensors, x))
            assert error <= tolerance, (
                f"apply() differs from x @ dequantize(checkpoint).T + b by {error:.3g} (relative), "
                f"more than {tolerance} for {dtype} activations {tuple(x.shape)}"
            )

    def test_error_against_the_float_weight_is_bounded(self, component, platform, shape):
        """Quantizing a float weight and applying it stays within :attr:`max_error` of the float layer."""
        gen = torch.Generator().manual_seed(3)
        weight = torch.randn(shape[1], shape[0], generator=gen) * shape[0] ** -0.5
        layer = self.build_layer(
            component, component(self.quant_config), shape, False, "float32", self.quantize(weight), platform
        )
        x = torch.randn(16, shape[0], generator=gen)
        with torch.no_grad():
            error = relative_error(layer(x), x.double() @ weight.double().T)
        bound = self.max_error + self.reference_tolerance["float32"]
        assert error <= bound, f"relative error {error:.3g} against the float weight exceeds max_error {self.max_error}"

    def test_one_method_serves_many_layers(self, component, platform):
        """The engine gives one instance to every linear layer: layers must not share state through it."""
        method = component(self.quant_config)
        shape = self.shapes[0]
        layers = []
        for seed in range(3):
            tensors = self.checkpoint(*shape, True, seed=10 + seed)
            layers.append((tensors, self.build_layer(component, method, shape, True, "float32", tensors, platform)))
        x = torch.randn(4, shape[0], generator=torch.Generator().manual_seed(4))
        for index, (tensors, layer) in reversed(list(enumerate(layers))):
            with torch.no_grad():
                error = relative_error(layer(x), self.reference(tensors, x))
            assert error <= self.reference_tolerance["float32"], (
                f"layer {index} of 3 built by one method instance computes another layer's weights "
                f"(relative error {error:.3g})"
            )

    def test_fused_layer_loads_each_shard_from_a_checkpoint_file(self, component, platform, shape, dtype, tmp_path):
        """Three projections fused into one ``MergedColumnLinear`` (as q/k/v) load from a safetensors
        file through ``load_checkpoint`` and compute the stacked dequantized shards."""
        from safetensors.torch import load_file, save_file

        method = component(self.quant_config)
        self.require_supported(method, platform, dtype)
        shards = {name: self.checkpoint(*shape, True, seed=20 + i) for i, name in enumerate("qkv")}
        file = tmp_path / "model.safetensors"
        save_file({f"attn.{s}_proj.{n}": t.contiguous() for s, ts in shards.items() for n, t in ts.items()}, file)
        with default_dtype(getattr(torch, dtype)):
            layer = MergedColumnLinear(
                shape[0], [shape[1]] * 3, True, method, "attn.qkv_proj", [f"attn.{s}_proj" for s in "qkv"]
            )
        holder = torch.nn.Module()
        holder.attn = torch.nn.Module()
        holder.attn.qkv_proj = layer
        load_checkpoint(holder, load_file(file).items())
        self.finish_loading(layer, platform)
        x = torch.randn(6, shape[0], generator=torch.Generator().manual_seed(5)).to(getattr(torch, dtype))
        with torch.no_grad():
            y = layer(x)
        expected = torch.cat([self.reference(tensors, x) for tensors in shards.values()], dim=-1)
        error = relative_error(y, expected)
        bound = self.reference_tolerance[dtype] + self.fused_tolerance
        assert error <= bound, (
            f"a fused layer of 3 shards differs from the stacked dequantized shards by {error:.3g} "
            f"(relative), more than {bound}: a shard was loaded into the wrong part of a parameter"
        )

    def test_resident_bytes_fit_the_format(self, component, platform, shape, dtype):
        """After loading, the layer holds about the checkpoint's bytes (weights stay quantized)."""
        method = component(self.quant_config)
        self.require_supported(method, platform, dtype)
        tensors = self.checkpoint(*shape, False, seed=6)
        layer = self.build_layer(component, method, shape, False, dtype, tensors, platform)
        resident = sum(t.numel() * t.element_size() for t in [*layer.parameters(), *layer.buffers()])
        stored = sum(t.numel() * t.element_size() for t in tensors.values())
        assert resident <= self.max_resident_ratio * stored, (
            f"the loaded layer holds {resident} bytes for a checkpoint of {stored} bytes "
            f"(more than {self.max_resident_ratio}x): weights should stay in the format's size"
        )

    def test_lora_adds_its_term_to_the_quantized_output(self, component, platform, shape, dtype):
        """LoRA over the quantized layer: ``y = apply(x) + (x A) B`` for an adapter's tokens, ``apply(x)``
        for the base tokens of the same batch; the slots take the checkpoint's feature counts."""
        method = component(self.quant_config)
        self.require_supported(method, platform, dtype)
        tensors = self.checkpoint(*shape, False, seed=7)
        layer = self.build_layer(component, method, shape, False, dtype, tensors, platform)
        holder = torch.nn.Module()
        holder.layer = layer
        slots = LoRASlots(holder, platform.lora_kernel() or TorchLoRAKernel(), max_loras=2, max_rank=8)
        assert slots.targets == {"layer": shape}, (
            f"LoRA slots see the layer as {slots.targets['layer']} (in, out) features; the checkpoint's are {shape}"
        )
        gen = torch.Generator().manual_seed(8)
        a = torch.randn(4, shape[0], generator=gen) * shape[0] ** -0.5
        b = torch.randn(shape[1], 4, generator=gen) * 0.5
        slots.load([SlotLoad(1, {"layer": (a, b)})])
        x = torch.randn(6, shape[0], generator=gen).to(getattr(torch, dtype))
        token_slots = torch.tensor([-1, 1, 1, -1, 1, -1])

        def run(slot_of_token: torch.Tensor) -> torch.Tensor:
            ctx = ForwardContext(None, None, None, [], {LORA_SLOT: slot_of_token})
            with torch.no_grad(), current_forward_context(ctx):
                return layer(x)

        y, base = run(token_slots), run(torch.full_like(token_slots, -1))
        adapted = token_slots >= 0
        assert y.dtype == x.dtype and torch.equal(y[~adapted], base[~adapted]), (
            "a base token's output changed when adapter tokens ran beside it"
        )
        expected = self.reference(tensors, x) + (x.double() @ a.double().T) @ b.double().T
        error = relative_error(y[adapted], expected[adapted])
        assert error <= self.reference_tolerance[dtype], (
            f"with LoRA, apply(x) + (x A) B differs from the dequantized reference by {error:.3g} (relative), "
            f"more than {self.reference_tolerance[dtype]} for {dtype}"
        )
