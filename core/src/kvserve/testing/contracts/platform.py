"""The Platform contract: consistent facts, a usable device, a positive memory budget, reproducible seeds."""

from __future__ import annotations

import random
import time
from typing import ClassVar

import pytest
import torch

from kvserve.interfaces import Platform
from kvserve.testing.contracts._base import ComponentContract


class PlatformContract(ComponentContract):
    """Every platform plugin must pass this. Subclass it and name the platform::

        class TestMyPlatform(PlatformContract):
            platform = "my_device"

    Checked without using the device: the class facts are consistent (registry name, torch
    device type, dtype names, a default dtype among the supported ones, preferred attention
    backends as names, a distributed backend name) and ``unavailable_reason`` answers fast
    without raising. On a machine where the platform is available (otherwise skipped with its
    reason): ``device()`` has the platform's device type and runs a matmul in every supported
    dtype, ``kv_cache_memory_bytes`` is a positive int, ``synchronize`` works, the distributed
    backend exists in this torch, and ``seed_everything`` makes torch and ``random`` reproducible
    (same seed, same numbers; another seed, other numbers).
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
        assert component.default_dtype in component.supported_dtypes, (
            f"default_dtype {component.default_dtype!r} is not among supported_dtypes {component.supported_dtypes}"
        )
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
        """``device()`` is of the platform's device type and computes in every supported dtype."""
        device = instance.device()
        assert isinstance(device, torch.device) and device.type == component.device_type, (
            f"device() returned {device!r}; expected a torch.device of type {component.device_type!r}"
        )
        for name in component.supported_dtypes:
            x = torch.ones(4, 4, dtype=getattr(torch, name), device=device)
            assert float((x @ x).sum()) == 64.0, f"a {name} matmul on {device} gave a wrong result"
        instance.synchronize()

    def test_kv_cache_memory_budget_is_positive(self, instance):
        """Without a configured budget the engine sizes the KV cache from this: a positive number of bytes."""
        budget = instance.kv_cache_memory_bytes(0, None)
        assert isinstance(budget, int) and budget > 0, f"kv_cache_memory_bytes(0, None) returned {budget!r}"

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
