"""The Platform contract: consistent facts, a usable device, a positive memory budget, reproducible seeds."""

from __future__ import annotations

import random
import time
from typing import ClassVar

import pytest
import torch

from kvserve.interfaces import DeviceCapability, Platform
from kvserve.testing.contracts._base import ComponentContract


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
      another seed, other numbers).
    """

    kind = "platform"
    interface = Platform
    platform: ClassVar[str]
    """Registry name of the platform under test."""

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
