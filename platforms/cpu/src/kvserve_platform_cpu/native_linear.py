"""The CPU platform's own GEMM (``csrc/linear.cpp``, AVX-512 or AVX2) for the dtypes it runs; oneDNN for the rest.

At decode batch sizes a step reads every weight from memory once, and oneDNN's packed matmul waits
on those reads between its computations; the C++ kernel prefetches each panel's next chunk while
computing on the current one. Measured on this project's 2-core AVX512-BF16 CPU over every
projection of a model in turn (distinct weights, so they come from DRAM as in a decode step;
``benchmarks/gemm_shapes.py --sweep``), against oneDNN's prepacked matmul: 1.2-1.3x at 32 rows,
1.2-1.5x at 8 rows and 1.1-1.5x at 1 row, in float32 and bfloat16, on the 125M Llama and SmolLM2
(a noisy shared machine: two bfloat16 runs gave 1.06x and 1.47x at 1 row). On one shape from a
hot cache it reaches ~90% of oneDNN at 256-512 rows, where prefills run. On CPUs with AMX the
kernel runs bfloat16 on AMX tiles (``avx512+amx``; measured in ``csrc/linear.cpp``: 1.1-1.2x
oneDNN's tile kernels at decode sizes, 0.73x at 2048 rows). On CPUs with AVX2 but no AVX-512 (``avx2``)
it runs float32 and bfloat16 as float32 FMA, bfloat16 weights widened as they are read: there
neither oneDNN nor ``F.linear`` has a fast bfloat16 path (5-7x slower at 32 rows; the sweep's
figures are in ``csrc/linear.cpp``).

FP8 (E4M3) weights: :meth:`NativeLinearKernel.pack_quantized` keeps them one byte an element, packed
into panels, and the kernel converts them to bfloat16 in registers as it multiplies (on AMX, a k step
at a time into L1 buffers the tiles load; ``csrc/linear.cpp``), float32 and bfloat16 activations, one
scale per tensor or per output feature; on AVX-512 with VBMI only (elsewhere, AVX2-only CPUs
included, the quantization method keeps its own path: the weight dequantized per layer).

GGUF weights (GGML blocks, ``csrc/ggml.cpp``): :meth:`NativeLinearKernel.apply_ggml` multiplies
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K blocks as the file stores them. Of bfloat16 and
float16 activations, up to three rows (decode steps of one to three sequences) of the 32-weight types
(Q4_0 to Q8_0) are quantized per 32-block to int8, as llama.cpp does, for integer dot products
(AVX-512 VNNI); more rows, and the K-quants, run on tiles of output features dequantized to bfloat16
in cache, each tile multiplied by every row (AVX512-BF16). float32 rows, any number, run on tiles
dequantized to float32 (the activations neither quantized nor rounded: the dense float32 product up
to the order of the sums; AVX-512 FMA). Each has a portable loop, taken where the CPU lacks the
instructions or where ``ggml_path`` says ``"portable"``; built when a GGUF model first asks for it.

Built on first use by :mod:`kvserve_cpu_native`; where it cannot be, oneDNN's kernel serves every dtype
and the start-up log says why.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

from kvserve.interfaces import LinearKernel
from kvserve_cpu_native import unavailable_reason

logger = logging.getLogger("kvserve")

LIBRARY = "kvserve_cpu_linear"
SOURCES = (Path(__file__).parent / "csrc" / "linear.cpp",)
GGML_LIBRARY = "kvserve_cpu_ggml"
GGML_SOURCES = (Path(__file__).parent / "csrc" / "ggml.cpp",)
GGML_TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
"""The GGML types ``csrc/ggml.cpp`` multiplies (its tiles), by gguf's name -> ggml's type id."""


class NativeLinearKernel(LinearKernel):
    """``dtypes`` on the C++ kernel; weights of other dtypes go to ``fallback`` (or stay on
    ``F.linear`` without one). A weight of the kernel's dtypes that it cannot take (no
    ``in_features``, or bfloat16 with an odd number) stays on ``F.linear``."""

    def __init__(self, dtypes: frozenset[torch.dtype], fallback: LinearKernel | None) -> None:
        self.dtypes = dtypes
        self.fallback = fallback
        _register_fake()
        ops = getattr(torch.ops, LIBRARY)
        self._pack, self._linear, self._on_amx = ops.pack.default, ops.linear.default, ops.on_amx.default
        self._gated_linear, self._logits = ops.gated_linear.default, ops.logits.default
        self._pack_fp8, self._fp8_linear = ops.pack_fp8.default, ops.fp8_linear.default
        self.fp8_dtypes = frozenset(d for d in (torch.float32, torch.bfloat16) if ops.fp8_supports(d))
        """Activation dtypes the kernel multiplies FP8 weights in (none without AVX-512 VBMI)."""
        self.name = ops.isa()
        """The instruction set the products run on, ``avx512`` or ``avx2``; ``avx512+amx`` once it has
        packed a weight that runs on AMX tiles (bfloat16 whose sizes fill them)."""
        self._ggml_part_ids: dict[tuple[tuple[str, int], ...], tuple[list[int], list[int]]] = {}
        """A GGUF layer's parts as ``ggml_layer`` takes them (type ids, out_features), worked out once per shape."""

    def pack(self, weight: torch.Tensor) -> torch.Tensor | None:
        if weight.dtype not in self.dtypes:
            return None if self.fallback is None else self.fallback.pack(weight)
        # The op cannot view an empty x as rows of zero features (it raises), so K = 0 stays dense.
        if weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[1] == 0:
            return None
        if weight.dtype == torch.bfloat16 and weight.shape[1] % 2:
            return None
        if self._on_amx(weight) and not self.name.endswith("+amx"):
            self.name += "+amx"
        return self._pack(weight.contiguous())

    def apply(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if packed.dtype not in self.dtypes:
            return self.fallback.apply(x, packed, bias)
        # The op has a fake implementation (_register_fake), so compiled graphs call it as an opaque kernel.
        return self._linear(x, packed, bias)

    def apply_logits(self, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        """One ``logits`` op: bfloat16 on the AVX-512 panels writes its rounded sums as float32 directly."""
        if packed.dtype not in self.dtypes:
            return self.fallback.apply_logits(x, packed)
        return self._logits(x, packed)

    def fuses_gated(self, activation: str, packed: torch.Tensor) -> bool:
        return activation == "silu" and packed.dtype in self.dtypes

    def apply_gated(self, x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
        """One ``gated_linear`` op: up to 64 rows on the AVX-512 panels, each thread streams gate's and up's panels
        of the same columns in turn and writes SiLU-and-mul of the two (the layer op's math) from L1; more rows,
        AMX tiles and AVX2 run the two products, then SiLU-and-mul."""
        return self._gated_linear(x, gate, up)

    def pack_quantized(self, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        # K pairs multiply together, so an odd in_features stays on the method's own path.
        if (
            weight.dtype != torch.float8_e4m3fn
            or dtype not in self.fp8_dtypes
            or weight.device.type != "cpu"
            or weight.dim() != 2
            or weight.shape[1] % 2
            or scale.numel() not in (1, weight.shape[0])
        ):
            return None
        return self._pack_fp8(weight.contiguous())

    def apply_quantized(
        self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return self._fp8_linear(x, packed, scale.reshape(-1), bias)

    @functools.cached_property
    def ggml_types(self) -> frozenset[str]:
        """:data:`GGML_TYPE_IDS`' types once ``csrc/ggml.cpp`` is built (on first use: only GGUF models pay for it)."""
        reason = unavailable_reason(GGML_LIBRARY, GGML_SOURCES)
        if reason is not None:
            logger.warning("kvserve-platform-cpu: GGML kernel unavailable (GGUF layers dequantize): %s", reason)
            return frozenset()
        _register_ggml_fake()
        # Asked now, at load: cached_property's lock is a context manager torch.compile cannot trace,
        # so apply_ggml must find the answers already cached when a compiled forward first runs it.
        _ = self.ggml_path
        return frozenset(GGML_TYPE_IDS)

    @functools.cached_property
    def ggml_path(self) -> str:
        """``avx512`` where the build has AVX-512 (each op takes its instructions where the build has
        them, its portable loop otherwise), else ``portable``; assign ``"portable"`` to run the portable
        loops on such a CPU (the tests compare both)."""
        ops = torch.ops.kvserve_cpu_ggml
        return "avx512" if ops.has_vnni() or ops.has_bf16() or ops.has_avx512() else "portable"

    def apply_ggml(self, x: torch.Tensor, blocks: torch.Tensor, parts: tuple[tuple[str, int], ...]) -> torch.Tensor:
        """One ``ggml_layer`` op, which picks a path per part: float32 rows on tiles dequantized to float32
        (the activations as they are: the dense float32 product up to the order of the sums). bfloat16 and
        float16 rows: up to ``ggml_dot_rows`` rows of Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 on integer dots (``x``
        quantized per block to int8); more rows and the K-quants on tiles dequantized to bfloat16, times
        ``x`` in bfloat16 (float16 rows are rounded to it). The result in ``x``'s dtype."""
        ids = self._ggml_part_ids.get(parts)
        if ids is None:
            ids = self._ggml_part_ids[parts] = (
                [GGML_TYPE_IDS[ggml_type] for ggml_type, _ in parts],
                [out_features for _, out_features in parts],
            )
        return torch.ops.kvserve_cpu_ggml.ggml_layer.default(x, blocks, *ids, self.ggml_path == "avx512")


@functools.cache
def _register_fake() -> None:
    """Once per process: the output's shape for ``torch.compile``'s tracing."""

    @torch.library.register_fake(f"{LIBRARY}::linear")
    def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], packed.shape[0]))

    @torch.library.register_fake(f"{LIBRARY}::gated_linear")
    def _(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], gate.shape[0]))

    @torch.library.register_fake(f"{LIBRARY}::logits")
    def _(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], packed.shape[0]), dtype=torch.float32)

    @torch.library.register_fake(f"{LIBRARY}::fp8_linear")
    def _(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], packed.shape[0]))


@functools.cache
def _register_ggml_fake() -> None:
    """Once per process, after the GGML library is loaded: its output's shape for ``torch.compile``."""

    @torch.library.register_fake(f"{GGML_LIBRARY}::ggml_linear")
    def _(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, out_features: int, vnni: bool) -> torch.Tensor:
        return x.new_empty((x.shape[0], out_features))

    @torch.library.register_fake(f"{GGML_LIBRARY}::ggml_tiled_linear")
    def _(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, out_features: int, simd: bool) -> torch.Tensor:
        return x.new_empty((x.shape[0], out_features), dtype=torch.float32)

    @torch.library.register_fake(f"{GGML_LIBRARY}::ggml_layer")
    def _(x: torch.Tensor, blocks: torch.Tensor, ggml_types: list[int], out_features: list[int], simd: bool):
        return x.new_empty((x.shape[0], sum(out_features)))


def native_linear_kernel(fallback: LinearKernel | None) -> LinearKernel | None:
    """The C++ kernel for float32 and bfloat16 (AVX512-BF16 or AMX), with ``fallback`` for the other
    dtypes; ``fallback`` alone where the kernel cannot be built or runs no dtype here."""
    reason = unavailable_reason(LIBRARY, SOURCES)
    if reason is not None:
        instead = "F.linear" if fallback is None else fallback.name
        logger.warning("kvserve-platform-cpu: native linear kernel unavailable, using %s: %s", instead, reason)
        return fallback
    ops = getattr(torch.ops, LIBRARY)
    dtypes = frozenset(dtype for dtype in (torch.float32, torch.bfloat16) if ops.supports(dtype))
    if not dtypes:
        return fallback
    return NativeLinearKernel(dtypes, fallback)
