"""The quantized-linear seam: per-shard loading, ignore lists, clear errors for stray tensors,
KV-cache scales, and dtype resolution through the quantization method."""

from __future__ import annotations

import pytest
import torch

from kvserve.components import resolve_dtype
from kvserve.config import EngineConfig
from kvserve.errors import ConfigError, WeightLoadError
from kvserve.interfaces import ParamLoading
from kvserve.layers import ColumnLinear, MergedColumnLinear, PagedAttention, UnquantizedLinearMethod, load_checkpoint
from kvserve_platform_cpu.platform import CpuPlatform


class IgnoringMethod(UnquantizedLinearMethod):
    """Dense weights under another name, so a layer it leaves unquantized is told apart."""

    name = "ignoring"

    def ignored_prefixes(self):
        return ["re:.*\\.down_proj", "model.layers.0.self_attn.o_proj"]

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix):
        layer.add_param("packed", torch.zeros(input_size, sum(output_sizes) // 2), ParamLoading(1, packed_factor=2))


class Bf16OnlyMethod(UnquantizedLinearMethod):
    name = "bf16_only"
    activation_dtypes = ("bfloat16",)


class Fp32OnlyMethod(UnquantizedLinearMethod):
    name = "fp32_only"
    activation_dtypes = ("float32",)


def _holder(**modules):
    holder = torch.nn.Module()
    for name, module in modules.items():
        holder.add_module(name, module)
    return holder


def test_packed_parameter_shards_land_in_their_columns():
    method = IgnoringMethod()
    layer = MergedColumnLinear(4, [6, 2], False, method, "mlp.fused", ["mlp.a", "mlp.b"])
    assert layer.quant_method is method and layer.packed.shape == (4, 4)
    a, b = torch.ones(4, 3), torch.full((4, 1), 2.0)
    load_checkpoint(_holder(mlp=_holder(fused=layer)), [("mlp.a.packed", a), ("mlp.b.packed", b)])
    torch.testing.assert_close(layer.packed.data, torch.cat([a, b], dim=1))


def test_ignored_layers_get_dense_weights():
    method = IgnoringMethod()
    for prefix in ("model.layers.3.mlp.down_proj", "model.layers.0.self_attn.o_proj"):
        layer = ColumnLinear(4, 4, False, method, prefix)
        assert layer.quant_method.name == "none" and layer.weight.shape == (4, 4), prefix
    assert ColumnLinear(4, 4, False, method, "model.layers.1.self_attn.o_proj").quant_method is method


def test_a_partly_ignored_fused_layer_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.layers\.0\.mlp\.down_proj.*fused layer model\.layers\.0\.mlp\.x"):
        MergedColumnLinear(
            4, [2, 2], False, IgnoringMethod(), "model.layers.0.mlp.x",
            ["model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"],
        )  # fmt: skip


def test_a_stray_tensor_is_named_with_what_its_layer_holds():
    holder = _holder(proj=ColumnLinear(4, 4, True, UnquantizedLinearMethod(), "proj"))
    with pytest.raises(WeightLoadError, match=r"'proj\.weight_scale' has no place .*proj holds \['bias', 'weight'\]"):
        load_checkpoint(holder, [("proj.weight", torch.ones(4, 4)), ("proj.weight_scale", torch.ones(1))])


def test_a_wrong_shape_names_the_tensor():
    holder = _holder(proj=ColumnLinear(4, 4, False, UnquantizedLinearMethod(), "proj"))
    with pytest.raises(WeightLoadError, match=r"proj\.weight: expected shape \(4, 4\), got \(4, 3\)"):
        load_checkpoint(holder, [("proj.weight", torch.ones(4, 3))])


def test_kv_cache_scales_load_when_present_and_default_to_one():
    def model():
        attn = _holder(attn=PagedAttention(2, 1, 4, 0.5, 0))
        return _holder(model=_holder(layers=torch.nn.ModuleList([_holder(self_attn=attn)])))

    absent = model()
    load_checkpoint(absent, [])
    assert float(absent.model.layers[0].self_attn.attn.k_scale) == 1.0
    present = model()
    scales = [("model.layers.0.self_attn.k_scale", torch.tensor(0.5)),
              ("model.layers.0.self_attn.v_proj.output_scale", torch.tensor([0.25]))]  # fmt: skip
    load_checkpoint(present, scales)
    attn = present.model.layers[0].self_attn.attn
    assert (float(attn.k_scale), float(attn.v_scale)) == (0.5, 0.25)


def test_auto_dtype_picks_one_the_method_runs_and_an_explicit_one_it_refuses_is_named():
    platform = CpuPlatform()
    auto = EngineConfig.from_flat(model="m")
    # Whatever the CPU's own default (bfloat16 with AMX/AVX512-BF16, else float32), a method that
    # runs only one dtype gets that one, and an unrestricted method gets the platform's default.
    assert resolve_dtype(auto, platform, Bf16OnlyMethod()) == torch.bfloat16
    assert resolve_dtype(auto, platform, Fp32OnlyMethod()) == torch.float32
    assert resolve_dtype(auto, platform, UnquantizedLinearMethod()) == getattr(torch, platform.default_dtype())
    with pytest.raises(ConfigError, match=r"quantization: 'bf16_only' cannot run .* float32"):
        resolve_dtype(EngineConfig.from_flat(model="m", dtype="float32"), platform, Bf16OnlyMethod())
