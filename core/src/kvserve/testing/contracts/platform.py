"""The Platform contract: consistent facts, a usable device, a positive memory budget, reproducible seeds."""

from __future__ import annotations

import random
import time
from typing import ClassVar

import pytest
import torch

from kvserve.interfaces import DeviceCapability, LinearKernel, LoRAKernel, Platform, SamplingKernel
from kvserve.layers.activation import GATED_ACTIVATIONS, gated_activation
from kvserve.lora.torch_kernel import TorchLoRAKernel
from kvserve.request import Request
from kvserve.sampling import Sampler
from kvserve.sampling_params import SamplingParams
from kvserve.testing.contracts._base import ComponentContract
from kvserve.testing.lora_reference import check_lora_kernel


class PlatformContract(ComponentContract):
    """Every platform plugin must pass this. Subclass it and name the platform::

        class TestMyPlatform(PlatformContract):
            platform = "my_device"

    Checked without using the device: the class facts are consistent (registry name, torch
    device type, dtype names, preferred attention backends as names, a distributed backend
    name) and ``unavailable_reason`` answers fast without raising. On a machine where the
    platform is available (otherwise skipped with its reason):

    - ``device()`` has the platform's device type and runs a matmul in every dtype the instance
      supports (a subset of the class's);
    - ``default_dtype()`` is one of them and ``default_dtype_reason()`` says why;
    - ``capability()`` is a well-formed :class:`~kvserve.interfaces.DeviceCapability`;
    - ``profile_peak_memory`` either does not measure (0, its function not run) or runs it once
      and counts a 64 MiB device allocation made and freed inside it;
    - ``kv_cache_memory_bytes`` is a positive int that never grows when more activation memory
      is set aside;
    - ``synchronize`` works, the distributed backend exists in this torch, and
      ``seed_everything`` makes torch and ``random`` reproducible (same seed, same numbers;
      another seed, other numbers);
    - a ``sampling_kernel()``, where the platform has one, draws the token where each row's
      cumulative distribution (float64) passes the uniform number, only tokens with probability,
      and answers the top-p question as the float64 masses do (up to float32 rounding); drawn
      through the sampler, tokens follow the truncated distribution;
    - the LoRA kernel (``lora_kernel()``, or core's PyTorch one where the platform has none) adds
      each token's adapter term as a dense per-token reference does, over segments of every length
      (decode rows, prefill chunks, empty segments) of several slots and packed output slices, and
      leaves the base model's rows exactly as they were;
    - where its ``linear_kernel()`` fuses a gated MLP (``fuses_gated``), ``apply_gated`` gives what
      ``apply`` on gate and on up, then PyTorch's activation-and-multiply give (up to rounding), at
      1, 7 and 33 rows, in every dtype the platform runs;
    - its ``apply_logits`` (the LM head's) gives float32 logits bit for bit ``apply``'s product
      widened, at the same rows, in every dtype the platform runs and the kernel packs.
    """

    kind = "platform"
    interface = Platform
    platform: ClassVar[str]
    """Registry name of the platform under test."""
    lora_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16")
    """Dtypes the LoRA kernel is checked in (those the platform runs); ``scripts/gpu-check`` adds float16."""

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        super().pytest_generate_tests(metafunc)
        if "lora_dtype" in metafunc.fixturenames:
            metafunc.parametrize("lora_dtype", self.lora_dtypes)

    @pytest.fixture(scope="class")
    @classmethod
    def instance(cls, component) -> Platform:
        """An instance of the platform, on a machine where it is available."""
        reason = component.unavailable_reason()
        if reason is not None:
            pytest.skip(f"platform {cls.platform!r} is unavailable here: {reason}")
        return component()

    def test_class_facts_are_consistent(self, component):
        """Facts the engine reads before instantiating anything are well formed."""
        assert component.supported_dtypes, "supported_dtypes is empty"
        for dtype in component.supported_dtypes:
            assert isinstance(getattr(torch, dtype, None), torch.dtype), f"{dtype!r} is not a torch dtype name"
        assert isinstance(component.preferred_attention_backends, tuple) and all(
            isinstance(name, str) and name for name in component.preferred_attention_backends
        ), f"preferred_attention_backends must be a tuple of names, got {component.preferred_attention_backends!r}"
        assert isinstance(component.distributed_backend, str) and component.distributed_backend, (
            "distributed_backend must name a torch.distributed backend"
        )
        torch.device(component.device_type)  # raises for a device type torch does not know

    def test_unavailable_reason_is_fast_and_never_raises(self, component):
        """Called for every installed platform under ``platform="auto"``: None or a readable reason, quickly."""
        started = time.perf_counter()
        reason = component.unavailable_reason()
        elapsed = time.perf_counter() - started
        assert reason is None or (isinstance(reason, str) and reason.strip()), (
            f"unavailable_reason() must return None or a reason, got {reason!r}"
        )
        assert elapsed < 2.0, f"unavailable_reason() took {elapsed:.1f}s; it must be cheap"

    def test_device_runs_every_supported_dtype(self, component, instance):
        """``device()`` is of the platform's device type and computes in every dtype the instance supports."""
        device = instance.device()
        assert isinstance(device, torch.device) and device.type == component.device_type, (
            f"device() returned {device!r}; expected a torch.device of type {component.device_type!r}"
        )
        assert instance.supported_dtypes and set(instance.supported_dtypes) <= set(component.supported_dtypes), (
            f"the instance's supported_dtypes {instance.supported_dtypes} must be a non-empty subset of the "
            f"class's {component.supported_dtypes}"
        )
        for name in instance.supported_dtypes:
            x = torch.ones(4, 4, dtype=getattr(torch, name), device=device)
            assert float((x @ x).sum()) == 64.0, f"a {name} matmul on {device} gave a wrong result"
        instance.synchronize()

    def test_default_dtype_is_supported_and_explained(self, instance):
        """``dtype="auto"`` resolves to a dtype this device runs, with a reason for the start-up line."""
        dtype = instance.default_dtype()
        assert dtype in instance.supported_dtypes, (
            f"default_dtype() {dtype!r} is not among supported_dtypes {instance.supported_dtypes}"
        )
        reason = instance.default_dtype_reason()
        assert isinstance(reason, str) and reason.strip(), f"default_dtype_reason() returned {reason!r}"

    def test_capability_is_well_formed(self, instance):
        """A name, an architecture version given whole (major and minor) or not at all, feature names."""
        cap = instance.capability()
        assert isinstance(cap, DeviceCapability), f"capability() returned {cap!r}, not a DeviceCapability"
        assert isinstance(cap.name, str) and cap.name.strip(), f"capability().name is {cap.name!r}"
        versioned = (cap.major, cap.minor)
        assert versioned == (None, None) or all(isinstance(v, int) and v >= 0 for v in versioned), (
            f"capability() major/minor must both be ints >= 0 or both None, got {versioned}"
        )
        assert isinstance(cap.features, frozenset) and all(isinstance(f, str) and f for f in cap.features), (
            f"capability().features must be a frozenset of names, got {cap.features!r}"
        )

    def test_profile_peak_memory_sees_memory_freed_inside(self, instance):
        """The engine profiles a forward whose activations are gone when it returns: the peak counts
        (skipped, saying so, for a platform that does not measure)."""
        device, calls = instance.device(), []
        size = 64 << 20

        def work() -> None:
            calls.append(1)
            block = torch.ones(size // 4, dtype=torch.float32, device=device)  # written, so really resident
            instance.synchronize()
            del block

        measured = instance.profile_peak_memory(work)
        if not calls and measured == 0:
            pytest.skip("this platform does not measure peak memory (0, without running the function)")
        assert calls == [1], f"profile_peak_memory ran its function {len(calls)} times; it must run it once"
        assert isinstance(measured, int) and measured >= size // 2, (
            f"profile_peak_memory reported {measured!r} bytes for a function that held {size} bytes at its peak"
        )

    def test_kv_cache_memory_budget_is_positive(self, instance):
        """Without a configured budget the engine sizes the KV cache from this: a positive number of bytes,
        no larger when more memory must stay free for activations."""
        budget = instance.kv_cache_memory_bytes(0, None)
        assert isinstance(budget, int) and budget > 0, f"kv_cache_memory_bytes(0, None) returned {budget!r}"
        for fraction in (None, 0.5):
            roomy = instance.kv_cache_memory_bytes(0, fraction)
            squeezed = instance.kv_cache_memory_bytes(1 << 30, fraction)
            assert isinstance(squeezed, int) and 0 <= squeezed <= roomy, (
                f"kv_cache_memory_bytes(1 GiB of activations, {fraction}) = {squeezed!r} bytes, "
                f"more than with none reserved ({roomy})"
            )

    def test_distributed_backend_is_available(self, component, instance):
        """The named torch.distributed backend exists in this torch build."""
        import torch.distributed as dist

        if not dist.is_available():
            pytest.skip("this torch build has no torch.distributed")
        assert dist.is_backend_available(component.distributed_backend), (
            f"distributed_backend {component.distributed_backend!r} is not available in this torch"
        )

    def test_seeding_is_reproducible(self, instance):
        """The same seed gives the same random numbers (torch on the device, Python's ``random``);
        a different seed gives different ones."""
        device = instance.device()

        def draw(seed: int) -> tuple[list[float], float]:
            instance.seed_everything(seed)
            values = torch.rand(8, device=device).tolist()
            return values, random.random()

        first, again, other = draw(1234), draw(1234), draw(4321)
        assert first == again, "seed_everything(1234) twice gave different random numbers"
        assert first[0] != other[0] and first[1] != other[1], "seed_everything(4321) gave the numbers of seed 1234"

    @pytest.fixture(scope="class")
    @classmethod
    def sampling_kernel(cls, instance) -> SamplingKernel:
        """The platform's own sampling kernel (skipped, saying so, for a platform that has none)."""
        kernel = instance.sampling_kernel()
        if kernel is None:
            pytest.skip("this platform has no sampling kernel of its own (core's PyTorch one is used)")
        assert isinstance(kernel, SamplingKernel), f"sampling_kernel() returned {kernel!r}, not a SamplingKernel"
        return kernel

    @pytest.mark.parametrize("vocab", [1, 7, 300, 1000, 32003])
    def test_sampling_kernel_draws_where_the_cumulative_distribution_passes_the_draw(
        self, instance, sampling_kernel, vocab
    ):
        """Rows of every temperature, min-p and top-p, some with masked (``-inf``) tokens, and uniform
        numbers from 0 to just below 1, against the exact answer in float64."""
        device, gen = instance.device(), torch.Generator().manual_seed(vocab)
        rows = 64
        logits = torch.randn(rows, vocab, generator=gen) * torch.linspace(0.1, 8.0, rows).unsqueeze(1)
        logits[::3][torch.rand(logits[::3].shape, generator=gen) < 0.5] = float("-inf")
        logits[:, 0] = logits[:, 0].clamp_min(-1e4)  # every row keeps a finite token
        temperature = torch.linspace(0.2, 1.5, rows)
        min_p = torch.tensor([0.0, 0.05, 0.3, 0.0])[torch.arange(rows) % 4]
        top_p = torch.tensor([1.0, 0.9, 0.5, 0.99, 0.1])[torch.arange(rows) % 5]
        uniform = torch.rand(rows, generator=gen)
        uniform[:4] = torch.tensor([0.0, 1e-9, 1 - 2**-24, 0.5])
        args = [t.to(device) for t in (logits, temperature, min_p, top_p, uniform)]
        tokens, inside = sampling_kernel.draw(*args)
        assert tokens.shape == inside.shape == (rows,) and tokens.dtype == torch.int64 and inside.dtype == torch.bool, (
            f"draw() returned {tokens.dtype} {tuple(tokens.shape)} and {inside.dtype} {tuple(inside.shape)}; "
            f"expected int64 and bool of shape ({rows},)"
        )
        probs = (logits.double() / temperature.double().unsqueeze(1)).softmax(dim=-1)
        probs[probs < probs.amax(dim=-1, keepdim=True) * min_p.double().unsqueeze(1)] = 0
        for row, (token, ok) in enumerate(zip(tokens.tolist(), inside.tolist())):
            p, total = probs[row], float(probs[row].sum())
            assert 0 <= token < vocab and p[token] > 0, (
                f"row {row}: draw() chose token {token}, which has no probability after min_p={float(min_p[row])}"
            )
            before, target = float(p[:token].sum()), float(uniform[row]) * total
            slack = 1e-5 * total
            assert before - slack <= target <= before + float(p[token]) + slack, (
                f"row {row}: token {token} covers the cumulative mass [{before / total:.6f}, "
                f"{(before + float(p[token])) / total:.6f}], which does not hold the draw {float(uniform[row]):.6f}"
            )
            above, limit = float(p[p > p[token]].sum()), float(top_p[row]) * total
            if abs(above - limit) > slack:
                assert ok == (above < limit), (
                    f"row {row}: inside={ok} for token {token}, but the mass above it is {above / total:.6f} "
                    f"of the row against top_p={float(top_p[row])}"
                )

    @pytest.mark.parametrize("params", [{"temperature": 0.8, "top_p": 0.9, "min_p": 0.05}, {"temperature": 1.0}])
    def test_sampling_kernel_draws_through_the_sampler_follow_the_distribution(self, instance, sampling_kernel, params):
        """20,000 draws of one row through the sampler with the platform's kernel: within sampling
        noise of the truncated distribution (total variation below 0.03 over 40 tokens), never outside it."""
        device, vocab, rows = instance.device(), 40, 2000
        logits = (torch.randn(1, vocab, generator=torch.Generator().manual_seed(1)) * 2).to(device)
        probs = (logits[0].double().cpu() / params["temperature"]).softmax(-1)
        probs[probs < probs.max() * params.get("min_p", 0.0)] = 0
        values = probs.sort(descending=True).values
        kept = values[(values.cumsum(0) - values) < params.get("top_p", 1.0) * probs.sum()]
        probs[probs < kept.min()] = 0
        expected = probs / probs.sum()
        sampler = Sampler(3, kernel=sampling_kernel)
        requests = [Request(f"r{i}", [0], SamplingParams(max_tokens=1, **params), ()) for i in range(rows)]
        counts = torch.zeros(vocab, dtype=torch.float64)
        for _ in range(10):
            tokens = torch.tensor(sampler(logits.expand(rows, vocab), requests).tokens)
            counts += torch.bincount(tokens, minlength=vocab).double()
        observed = counts / counts.sum()
        outside = set(observed.nonzero().flatten().tolist()) - set(expected.nonzero().flatten().tolist())
        assert not outside, f"tokens {sorted(outside)} were drawn though {params} gives them no probability"
        distance = 0.5 * float((observed - expected).abs().sum())
        assert distance < 0.03, f"the draws' total variation from the distribution of {params} is {distance:.3f}"

    @pytest.fixture(scope="class")
    @classmethod
    def lora_kernel(cls, instance) -> LoRAKernel:
        """The platform's LoRA kernel, or core's reference where it has none (the one the engine runs)."""
        kernel = instance.lora_kernel() or TorchLoRAKernel()
        assert isinstance(kernel, LoRAKernel), f"lora_kernel() returned {kernel!r}, not a LoRAKernel"
        return kernel

    def test_lora_kernel_matches_a_dense_reference(self, instance, lora_kernel, lora_dtype, seed):
        """Segments of every length from 1 to 9 tokens (adjacent ones of different slots too), base rows
        between them, empty segments, three packed output slices of different widths; against
        ``y + x A[slot] B[slot]`` per token in float64 (:func:`~kvserve.testing.lora_reference.check_lora_kernel`)."""
        if lora_dtype not in instance.supported_dtypes:
            pytest.skip(f"the platform does not run {lora_dtype}")
        check_lora_kernel(lora_kernel, instance.device(), getattr(torch, lora_dtype), seed)

    @pytest.fixture(scope="class")
    @classmethod
    def linear_kernel(cls, instance) -> LinearKernel:
        """The platform's linear kernel; skipped where it has none (layers then run ``F.linear``)."""
        kernel = instance.linear_kernel()
        if kernel is None:
            pytest.skip("the platform offers no linear kernel: dense layers run F.linear")
        assert isinstance(kernel, LinearKernel), f"linear_kernel() returned {kernel!r}, not a LinearKernel"
        return kernel

    @pytest.mark.parametrize("activation", sorted(GATED_ACTIVATIONS))
    def test_linear_kernel_gated_product_is_two_products_and_the_activation(
        self, instance, linear_kernel, activation, seed
    ):
        """100 output features (not a multiple of common panel widths) over 64 inputs, per dtype the
        platform runs and the kernel packs and fuses."""
        device, fused = instance.device(), []
        act = gated_activation(activation)
        for dtype_name in instance.supported_dtypes:
            gen = torch.Generator().manual_seed(seed)
            gate, up = (torch.randn(100, 64, generator=gen).to(device, getattr(torch, dtype_name)) for _ in range(2))
            packed_gate, packed_up = linear_kernel.pack(gate), linear_kernel.pack(up)
            if packed_gate is None or packed_up is None or not linear_kernel.fuses_gated(activation, packed_gate):
                continue
            for rows in (1, 7, 33):
                x = torch.randn(rows, 64, generator=gen).to(device, getattr(torch, dtype_name))
                expected = act(linear_kernel.apply(x, packed_gate, None), linear_kernel.apply(x, packed_up, None))
                where = f"apply_gated ({activation}, {dtype_name}, {rows} rows) is not {activation}(gate) * up"
                torch.testing.assert_close(
                    linear_kernel.apply_gated(x, packed_gate, packed_up, activation),
                    expected,
                    msg=lambda m, where=where: f"{where}: {m}",
                )
            fused.append(dtype_name)
        if not fused:
            pytest.skip(f"the linear kernel fuses no gated {activation} MLP in {list(instance.supported_dtypes)}")

    def test_linear_kernel_logits_are_its_product_widened_to_float32(self, instance, linear_kernel, seed):
        """100 vocabulary rows over 64 inputs, per dtype the platform runs and the kernel packs: the
        sampler's float32 logits are the values the product in that dtype rounds to."""
        device, packed_dtypes = instance.device(), []
        for dtype_name in instance.supported_dtypes:
            gen = torch.Generator().manual_seed(seed)
            packed = linear_kernel.pack(torch.randn(100, 64, generator=gen).to(device, getattr(torch, dtype_name)))
            if packed is None:
                continue
            for rows in (1, 7, 33):
                x = torch.randn(rows, 64, generator=gen).to(device, getattr(torch, dtype_name))
                logits = linear_kernel.apply_logits(x, packed)
                where = f"apply_logits ({dtype_name}, {rows} rows)"
                assert logits.dtype == torch.float32, f"{where} gave {logits.dtype}, not float32"
                expected = linear_kernel.apply(x, packed, None).float()
                mismatched = (logits != expected).sum().item()
                assert mismatched == 0, (
                    f"{where} is not apply's product widened to float32: {mismatched} of {expected.numel()} "
                    f"logits differ (largest by {(logits - expected).abs().max().item():.3g})"
                )
            packed_dtypes.append(dtype_name)
        if not packed_dtypes:
            pytest.skip(f"the linear kernel packs no weight in {list(instance.supported_dtypes)}")
