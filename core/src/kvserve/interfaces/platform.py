"""The Platform interface: what the engine needs to know about a device kind."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

    from kvserve.interfaces.layer_ops import LayerOps
    from kvserve.interfaces.linear_kernel import LinearKernel
    from kvserve.interfaces.lora_kernel import LoRAKernel
    from kvserve.interfaces.sampling_kernel import SamplingKernel


@dataclass(frozen=True)
class DeviceCapability:
    """What the platform's device can do, for backends and quantization methods to check.

    ``major``/``minor`` are a versioned architecture where the device has one (CUDA compute
    capability: sm_90 is ``9, 0``) and ``None`` where it has none (CPUs). ``features`` are
    names of instruction-set or hardware features as the platform spells them (CPU: the
    ``/proc/cpuinfo`` flags such as ``"avx512_bf16"``; CUDA: ``"bf16"``, ``"fp8"``...).
    """

    name: str
    """Human-readable device name, e.g. ``"NVIDIA H100 80GB HBM3"`` or the CPU model."""
    major: int | None = None
    minor: int | None = None
    features: frozenset[str] = frozenset()

    def at_least(self, major: int, minor: int = 0) -> bool:
        """True if the device has a versioned architecture of at least ``major.minor``."""
        return self.major is not None and (self.major, self.minor or 0) >= (major, minor)


class Platform(ABC):
    """A device kind (CPU, CUDA, ...). One instance is made per engine.

    Class attributes are facts the engine reads before instantiating anything heavy;
    methods answer for the device this instance drives. In a tensor-parallel worker
    (``kvserve.distributed.is_worker()``), a platform with several devices drives the one of
    index ``kvserve.distributed.local_rank()`` among those the process sees.
    """

    name: ClassVar[str]
    """Registry name, e.g. ``"cpu"``."""
    device_type: ClassVar[str]
    """The torch device type, e.g. ``"cpu"`` or ``"cuda"``."""
    supported_dtypes: tuple[str, ...]
    """Model/KV dtypes this platform may run, as torch dtype names (``"float32"``, ``"bfloat16"``...).
    A class attribute listing every dtype the platform can ever run; an instance may narrow it to
    what its own device runs (set ``self.supported_dtypes`` in ``__init__``: a CUDA device before
    sm80 has no bfloat16)."""
    preferred_attention_backends: ClassVar[tuple[str, ...]]
    """Attention backend names to try first under ``attention_backend="auto"``, best first."""
    distributed_backend: ClassVar[str]
    """The torch.distributed backend for this device (``"gloo"``, ``"nccl"``)."""
    ray_resource: ClassVar[str | None] = None
    """The Ray resource one tensor-parallel rank's device is counted in (``"GPU"``): the Ray
    executor's placement group asks for one per rank, beside one CPU. None where a rank needs
    only its CPU."""

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """Why this platform cannot run in this process (``None`` when it can).

        Must be cheap and must not raise: it is called for every installed platform under ``auto``.
        """

    @abstractmethod
    def device(self) -> torch.device:
        """The torch device models and KV caches live on."""

    @abstractmethod
    def default_dtype(self) -> str:
        """The dtype name used when the config says ``dtype="auto"``: one of ``self.supported_dtypes``,
        chosen for this device at run time (e.g. bfloat16 only where the device computes it natively)."""

    @abstractmethod
    def default_dtype_reason(self) -> str:
        """One short phrase saying why :meth:`default_dtype` was chosen, for the engine's start-up
        line, e.g. ``"CPU has AVX512-BF16"`` or ``"sm_90 runs bfloat16 natively"``."""

    @abstractmethod
    def capability(self) -> DeviceCapability:
        """The device's name, architecture version and features (see :class:`DeviceCapability`)."""

    @abstractmethod
    def profile_peak_memory(self, fn: Callable[[], object]) -> int:
        """Run ``fn`` (the engine passes one forward at ``max_num_batched_tokens``) and return the bytes
        of peak device memory it used beyond what was in use before it: the activation memory the KV
        cache budget must leave free (CUDA: the ``max_memory_allocated`` rise).

        A platform that does not measure returns 0 *without running* ``fn`` (the CPU: host memory
        dwarfs the activations, and the forward would cost seconds of start-up); one that runs
        ``fn`` runs it once and must count memory allocated and freed inside it.
        """

    @abstractmethod
    def kv_cache_memory_bytes(self, peak_activation_bytes: int, fraction: float | None) -> int:
        """Bytes the KV cache (every layer, scales and backend workspace included) may use, when the
        config gives neither a byte budget nor a block count.

        Called after the weights are loaded and :meth:`profile_peak_memory` measured
        ``peak_activation_bytes``. ``fraction`` is the config's ``kv_cache_memory_fraction``
        (``0 < fraction <= 1``): the share of the device memory still free, once
        ``peak_activation_bytes`` are set aside, that the KV cache may take; ``None`` means the
        platform's own default (CPU: 0.25, capped at 4 GiB; CUDA: 0.9). Returns an int ``>= 0``
        (0 when nothing is left; the engine then says the cache cannot hold a sequence).
        """

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until queued device work is finished (a no-op on synchronous devices)."""

    @abstractmethod
    def seed_everything(self, seed: int) -> None:
        """Seed every random number generator the platform's computations use."""

    def linear_kernel(self) -> LinearKernel | None:
        """The platform's own GEMM for unquantized linear layers and the LM head, whose weights the
        engine repacks once after loading (see :class:`LinearKernel`); ``None`` (the default): every
        layer runs ``torch.nn.functional.linear`` on its dense weight.

        Called once per engine; import the kernel's library here, not at module import.
        """
        return None

    def layer_ops(self) -> LayerOps | None:
        """The platform's fused RMSNorm, SiLU-and-mul and rotary kernels for eager steps (see
        :class:`LayerOps`); ``None`` (the default): core's PyTorch ops (``kvserve.layers.TorchLayerOps``).
        A platform whose kernels are unavailable here returns ``TorchLayerOps(reason=...)`` so the
        start-up line says why.

        Called once per engine, at optimization level 0 only (compiled levels fuse these ops
        themselves); build or import the kernels here, not at module import.
        """
        return None

    def sampling_kernel(self) -> SamplingKernel | None:
        """The platform's fused draw for sampled rows (see :class:`SamplingKernel`); ``None`` (the
        default): core's PyTorch one (``kvserve.sampling.torch_kernel.TorchSamplingKernel``). A
        platform whose kernel is unavailable here returns ``TorchSamplingKernel(reason=...)``.

        Called once per engine; build or import the kernel here, not at module import.
        """
        return None

    def lora_kernel(self) -> LoRAKernel | None:
        """The platform's batched LoRA shrink/expand (see :class:`LoRAKernel`); ``None`` (the default):
        core's PyTorch one (``kvserve.lora.torch_kernel.TorchLoRAKernel``).

        Called once per engine that has ``enable_lora``; build or import the kernel here, not at
        module import.
        """
        return None
