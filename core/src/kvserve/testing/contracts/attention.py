"""The AttentionBackend contract: the same numbers as a float64 reference, on real paged batches."""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import pytest
import torch

from kvserve.interfaces import AttentionBackend, AttentionSpec, DeviceCapability, LayerAttentionSpec, Platform
from kvserve.plugins import get_plugin_manager, load_component
from kvserve.testing.attention_reference import (
    PagedCase,
    build_batch,
    make_paged_case,
    past_batch,
    reference_attention,
)
from kvserve.testing.contracts._base import ComponentContract, violation

SCENARIO_NAMES = ("prefill", "decode", "chunked", "mixed")


def scenario(name: str, block_size: int) -> list[tuple[int, int]]:
    """A batch as ``(cached tokens, new tokens)`` per sequence: prefills, decodes, chunked
    prefills (queries starting mid-sequence) and all of them mixed in one batch.

    Lengths scale with ``block_size`` so that, whatever the block size, sequences span several
    blocks, end on and next to block boundaries, and chunks start inside a block.
    """
    b = block_size
    return {
        "prefill": [(0, b + 7), (0, 2 * b + 3), (0, 2)],
        "decode": [(b + 4, 1), (2 * b + 5, 1), (3 * b, 1), (1, 1), (b - 1, 1)],
        "chunked": [(b + 8, 5), (b - 3, 16), (3, b + 9)],
        "mixed": [(0, 7), (b + 5, 1), (2 * b + 4, 1), (3, b + 9), (3 * b + 8, 1), (0, 1)],
    }[name]


def lookahead_scenario(block_size: int) -> list[tuple[int, int]]:
    """Speculative decoding's verification step: short queries of 1 + k tokens (k = 1..7) over long
    contexts (many blocks, some spans crossing a block boundary), mixed with decodes and a prefill."""
    b = block_size
    return [
        (0, b + 5),  # a prefill
        (20 * b + 3, 1),  # decodes
        (20 * b - 1, 2),  # 1 + 1: the two rows on either side of a block boundary
        (24 * b + 6, 4),
        (17 * b - 3, 8),  # 1 + 7 across a boundary
        (9 * b + 7, 1),
        (32 * b - 2, 3),
        (6 * b + 1, 6),
    ]


LOOKAHEAD_KINDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "window-softcap": {"scale": 0.2, "sliding_window": 45, "logits_soft_cap": 3.0},
}
"""Layer facts of :meth:`AttentionBackendContract.test_short_multi_token_queries_over_long_contexts`:
the default layer, and a window longer than the 1 + k rows yet far shorter than the contexts."""


HEAD_LAYOUTS: dict[str, tuple[int, int]] = {"mha": (4, 4), "gqa": (8, 2), "mqa": (4, 1)}
"""``(query heads, KV heads)``."""

LAYER_KINDS: dict[str, dict[str, Any]] = {
    "scale": {"scale": 0.3},
    "window": {"sliding_window": 5},
    "softcap": {"logits_soft_cap": 1.5},
    "window-softcap": {"scale": 0.2, "sliding_window": 9, "logits_soft_cap": 3.0},
}
"""Layer facts beyond the defaults (scale ``head_dim ** -0.5``, no window, no cap), tried on the
mixed scenario: windows shorter than its prefills, chunks and decodes, and crossing blocks."""

FEATURE_WORDS: dict[str, tuple[str, ...]] = {"sliding_window": ("window",), "logits_soft_cap": ("soft", "cap")}
"""What a refusal of a layer feature must mention; the scale cannot be refused."""


class AttentionCase(NamedTuple):
    """One configuration of the reference comparison; its ``str`` is the test id."""

    scenario: str
    layout: str
    head_dim: int
    block_size: int
    dtype: str

    def __str__(self) -> str:
        return f"{self.scenario}-{self.layout}-d{self.head_dim}-bs{self.block_size}-{self.dtype}"


class LayerKindCase(NamedTuple):
    """A :data:`LAYER_KINDS` entry on the mixed GQA scenario; its ``str`` is the test id."""

    kind: str
    head_dim: int
    block_size: int
    dtype: str

    def __str__(self) -> str:
        return f"{self.kind}-mixed-gqa-d{self.head_dim}-bs{self.block_size}-{self.dtype}"


class LookaheadCase(NamedTuple):
    """A :data:`LOOKAHEAD_KINDS` entry on :func:`lookahead_scenario`; its ``str`` is the test id."""

    kind: str
    dtype: str

    def __str__(self) -> str:
        return f"{self.kind}-{self.dtype}"


def layer_spec(head_dim: int, **facts: Any) -> LayerAttentionSpec:
    """A layer with the default scale ``head_dim ** -0.5`` unless ``facts`` say otherwise."""
    return LayerAttentionSpec(**{"scale": head_dim**-0.5, **facts})


class _NowherePlatform(Platform):
    """A platform no real backend runs on, to ask backends for their refusal reasons."""

    name = "nowhere"
    device_type = "nowhere"
    supported_dtypes = ("float32",)
    preferred_attention_backends = ()
    distributed_backend = "gloo"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return "not a real device"

    def device(self) -> torch.device:
        return torch.device("cpu")

    def default_dtype(self) -> str:
        return "float32"

    def default_dtype_reason(self) -> str:
        return "the only dtype"

    def capability(self) -> DeviceCapability:
        return DeviceCapability(name="nowhere")

    def profile_peak_memory(self, fn: Callable[[], object]) -> int:
        return 0  # measures nothing, so fn need not run

    def kv_cache_memory_bytes(self, peak_activation_bytes: int, fraction: float | None) -> int:
        return 0

    def synchronize(self) -> None:
        """Nothing runs here."""

    def seed_everything(self, seed: int) -> None:
        """Nothing runs here."""


class AttentionBackendContract(ComponentContract):
    """Every attention backend plugin must pass this. Subclass it and name the backend::

        class TestMyBackend(AttentionBackendContract):
            backend = "my_backend"

    What is checked, on batches whose block tables are random permutations of the cache's
    blocks (block 0, the null block, pads the tables and holds garbage, as does every slot
    not written), with this step's K/V written by ``write_kv`` before ``forward``:

    - ``forward`` equals a float64 reference (:func:`~kvserve.testing.attention_reference.causal_attention`)
      for pure prefills, pure decodes, chunked prefills (queries starting mid-sequence) and
      mixed batches; MHA, GQA and MQA; head sizes :attr:`head_sizes`; the block sizes the
      backend claims (``default_block_size`` and ``3 * block_size_multiple``); dtypes
      :attr:`dtypes` within :attr:`tolerances`. A configuration the backend refuses through
      ``unsupported_reasons`` is skipped with those reasons. On a mismatch the message names
      the sequences that differ (prefill, chunked prefill or decode) and, when the output
      matches a known bug (causal mask off by one, no causal mask, GQA head mapping, cached
      tokens ignored, scale ignored, sliding window ignored or off by one, soft-cap ignored),
      that bug;
    - the per-layer facts of :data:`LAYER_KINDS` (a non-default scale, sliding windows,
      logit soft-caps) are applied as the reference applies them, or a window / soft-cap is
      refused with a reason naming it; layers of different kinds share one metadata;
    - sequences span several blocks whatever the block size (:func:`scenario` scales with it);
      ``query``/``key``/``value`` may be strided views of one fused qkv tensor; block ids may be
      the last of a large pool; one batch may hold 64 sequences of very different lengths;
    - short queries of 1 + k tokens (speculative decoding's verification step) over contexts of
      hundreds of tokens, among decodes and a prefill, with and without a window and soft-cap
      (:func:`lookahead_scenario`);
    - ``forward`` leaves the cache unchanged; one ``build_metadata`` result serves every layer;
    - ``write_kv`` changes exactly the K and V rows of the ``slot_mapping`` slots, skips tokens
      whose slot is -1, and each token's K/V lands in its own slot (for caches whose layout
      :meth:`kv_slots` can read);
    - ``unsupported_reasons`` returns readable reasons naming what is refused (a dtype, a
      platform, a block size, a head count) and ``[]`` for what is served; a head size in
      :attr:`probe_head_sizes` is either refused with a reason naming it or computed correctly;
    - class facts are consistent (registry name, device types, dtypes, block sizes); the cache
      layout too (``kv_cache_shape`` holds K and V of every slot, ``kv_cache_bytes_per_block``
      counts at least that, ``allocate_kv_cache`` gives one cache per layer).

    Tests run on the first installed, available platform whose device type the backend
    supports (or :attr:`platform_name`); without one they are skipped with the reason. A backend
    whose kernels an interpreter can run on the host sets :attr:`host_interpreter_env` to run there
    when no accelerator platform is available.
    """

    kind = "attention_backend"
    interface = AttentionBackend
    backend: ClassVar[str]
    """Registry name of the backend under test."""
    platform_name: ClassVar[str | None] = None
    """Platform to run on; None: the first available platform the backend supports."""
    head_sizes: ClassVar[tuple[int, ...]] = (64, 128)
    probe_head_sizes: ClassVar[tuple[int, ...]] = (32, 80, 256)
    """Less common head sizes: served correctly, or refused with a reason naming the size."""
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16")
    host_interpreter_env: ClassVar[dict[str, str]] = {}
    """For a backend whose kernels an interpreter can run on the host (a kernel language's own
    interpreter, switched on by environment variables): when no accelerator platform is available,
    these variables are set before the backend is loaded and it runs on the host platform instead of
    skipping. The backend keeps the host device type out of its ``device_types`` (so ``auto`` never
    picks it there) and accepts the host platform in ``unsupported_reasons`` only while they are set."""
    host_interpreter_modules: ClassVar[tuple[str, ...]] = ()
    """Modules that read :attr:`host_interpreter_env` once, when imported: already imported, the
    switch fails saying so (set the variables in the environment or a conftest.py instead)."""
    tolerances: ClassVar[dict[str, tuple[float, float]]] = {
        "float32": (2e-5, 2e-5),
        "bfloat16": (2e-2, 2e-2),
        "float16": (2e-3, 2e-3),
    }
    """``(atol, rtol)`` against the float64 reference computed from the same (rounded) inputs."""

    # -- hooks -----------------------------------------------------------------------------
    @classmethod
    def block_sizes(cls, component: type[AttentionBackend]) -> list[int]:
        """Block sizes to test: the default one and a small odd multiple of ``block_size_multiple``."""
        return sorted({component.default_block_size, 3 * component.block_size_multiple})

    def kv_slots(
        self, kv_cache: torch.Tensor, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """K and V of every slot, each ``[num_blocks * block_size, num_kv_heads, head_dim]``, read
        from a cache in the backend's layout; None when the layout is not understood.

        The default understands every permutation of ``(2, num_blocks, block_size, num_kv_heads,
        head_dim)`` (the test picks distinct sizes). Override it for packed layouts, or the exact
        per-slot check of ``write_kv`` is skipped with a warning.
        """
        canonical = (2, num_blocks, block_size, num_kv_heads, head_dim)
        shape = tuple(kv_cache.shape)
        if len(set(canonical)) < len(canonical) or sorted(shape) != sorted(canonical):
            return None
        view = kv_cache.permute([shape.index(size) for size in canonical])
        num_slots = num_blocks * block_size
        return view[0].reshape(num_slots, num_kv_heads, head_dim), view[1].reshape(num_slots, num_kv_heads, head_dim)

    # -- fixtures and helpers --------------------------------------------------------------
    @classmethod
    def load_component(cls) -> type[AttentionBackend]:
        """The backend class; with :attr:`host_interpreter_env` and no accelerator platform, loaded
        with the interpreter switched on."""
        if cls.host_interpreter_env:
            _interpreter_unless_accelerator(cls.host_interpreter_env, cls.host_interpreter_modules)
        return super().load_component()

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        super().pytest_generate_tests(metafunc)
        try:
            block_sizes = self.block_sizes(type(self).load_component())
        except Exception:  # the component fixture reports why the backend cannot be loaded
            block_sizes = [16]
        if "kind_case" in metafunc.fixturenames:
            kind_cases = [
                LayerKindCase(kind, self.head_sizes[0], block_size, dtype)
                for kind in LAYER_KINDS
                for block_size in block_sizes
                for dtype in self.dtypes
            ]
            metafunc.parametrize("kind_case", kind_cases, ids=str)
        if "case" in metafunc.fixturenames:
            cases = [
                AttentionCase(scenario, layout, head_dim, block_size, dtype)
                for scenario in SCENARIO_NAMES
                for layout in HEAD_LAYOUTS
                for head_dim in self.head_sizes
                for block_size in block_sizes
                for dtype in self.dtypes
            ]
            metafunc.parametrize("case", cases, ids=str)
        if "lookahead_case" in metafunc.fixturenames:
            lookahead_cases = [LookaheadCase(kind, dtype) for kind in LOOKAHEAD_KINDS for dtype in self.dtypes]
            metafunc.parametrize("lookahead_case", lookahead_cases, ids=str)
        if "dtype" in metafunc.fixturenames:
            metafunc.parametrize("dtype", self.dtypes)
        if "probe_head_size" in metafunc.fixturenames:
            metafunc.parametrize("probe_head_size", self.probe_head_sizes)

    @pytest.fixture(scope="class")
    @classmethod
    def target_platform(cls, component) -> Platform:
        """An instance of the platform the backend runs on in these tests."""
        names = [cls.platform_name] if cls.platform_name else get_plugin_manager().registry("platform").names()
        tried = []
        for name in names:
            platform_cls = load_component("platform", name)
            interpreted = platform_cls.device_type == "cpu" and _interpreter_on(cls.host_interpreter_env)
            if platform_cls.device_type not in component.device_types and not interpreted:
                tried.append(f"{name}: device type {platform_cls.device_type!r}")
                continue
            reason = platform_cls.unavailable_reason()
            if reason is not None:
                tried.append(f"{name}: {reason}")
                continue
            return platform_cls()
        pytest.skip(
            f"no available platform for attention backend {cls.backend!r} "
            f"(it runs on {', '.join(component.device_types)}; installed: {'; '.join(tried) or 'none'})"
        )

    def spec(
        self,
        platform: Platform,
        layout: tuple[int, int],
        head_dim: int,
        dtype: str,
        block_size: int,
        layers: tuple[LayerAttentionSpec, ...] | None = None,
    ) -> AttentionSpec:
        """The AttentionSpec of a configuration on ``platform``'s device (``layout``: query and KV
        heads); ``layers`` default to one layer of default facts."""
        layers = layers or (layer_spec(head_dim),)
        return AttentionSpec(
            layout[0], layout[1], head_dim, getattr(torch, dtype), block_size, platform.device(), layers
        )

    def require_served(self, component, spec: AttentionSpec, platform: Platform) -> None:
        """Skip the test, with the backend's reasons, if it refuses ``spec``."""
        reasons = component.unsupported_reasons(spec, platform)
        if reasons:
            pytest.skip(f"backend refuses this configuration: {'; '.join(reasons)}")

    def require_served_or_named(self, component, spec: AttentionSpec, platform: Platform, facts: dict) -> None:
        """Skip the test if the backend refuses ``spec``, whose layers use ``facts``, with a reason
        naming one of them (a window, a soft-cap); fail if it refuses without naming any."""
        reasons = component.unsupported_reasons(spec, platform)
        if not reasons:
            return
        words = [word for fact in facts for word in FEATURE_WORDS.get(fact, ())]
        if not any(word in reason.lower() for reason in reasons for word in words):
            violation(
                f"unsupported_reasons refuses layers with {facts} without naming what it lacks "
                f"(every backend applies the spec's scale): {reasons!r}"
            )
        pytest.skip(f"backend refuses these layer facts: {'; '.join(reasons)}")

    def run_case(
        self,
        component,
        platform,
        spec: AttentionSpec,
        seqs,
        seed: int,
        *,
        num_blocks: int | None = None,
        transform: Callable[[PagedCase], PagedCase] | None = None,
    ):
        """Write the cached and new K/V of a random case through the backend and run ``forward``.

        Returns ``(cases, outputs)``, one per layer of ``spec``; all layers share one ``build_metadata``.
        ``num_blocks`` is the cache's block count (default: twice what the case needs);
        ``transform`` rewrites each random case before it is used (e.g. :func:`fused_qkv_views`,
        :func:`at_end_of_pool`).
        """
        device = spec.device
        blocks_needed = sum(-(-(c + q) // spec.block_size) for c, q in seqs)
        case_blocks = 2 * blocks_needed + 2  # half the blocks stay unused, filled with garbage
        num_blocks = num_blocks or case_blocks
        backend = component(spec)
        shape = backend.kv_cache_shape(num_blocks)
        cases, caches = [], []
        for layer in range(spec.num_layers):
            case = make_paged_case(
                seqs, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.block_size, case_blocks,
                spec.dtype, seed=seed * 7 + layer, device=device,
            )  # fmt: skip
            if transform is not None:
                case = transform(case)
            if layer:  # every layer shares the first layer's batch (block tables, slots)
                case = dataclasses.replace(case, batch=cases[0].batch, tables=cases[0].tables)
            cache = garbage_cache(shape, spec.dtype, device, seed)
            past = past_batch(case)
            if past is not None:
                batch, keys, values = past
                backend.write_kv(cache, keys, values, backend.build_metadata(batch))
            cases.append(case)
            caches.append(cache)
        metadata = backend.build_metadata(cases[0].batch)
        outputs = []
        for layer, (case, cache) in enumerate(zip(cases, caches)):
            backend.write_kv(cache, case.key, case.value, metadata)
            before = cache.clone()
            out = backend.forward(case.query, cache, metadata, layer)
            if not torch.equal(cache, before):
                violation("forward() modified the KV cache; only write_kv may store K/V")
            expected_shape = (case.batch.num_tokens, spec.num_heads, spec.head_dim)
            if tuple(out.shape) != expected_shape or out.dtype != spec.dtype:
                violation(
                    f"forward() returned {tuple(out.shape)} {out.dtype}; expected {expected_shape} {spec.dtype} "
                    "([num_tokens, num_heads, head_dim] in the query's dtype)"
                )
            outputs.append(out)
        platform.synchronize()
        return cases, outputs

    def check_against_reference(
        self, case: PagedCase, out: torch.Tensor, spec: AttentionSpec, what: str, layer_idx: int = 0
    ) -> None:
        """Fail, naming the sequences that differ and the bug that explains them if known."""
        dtype = str(spec.dtype).removeprefix("torch.")
        atol, rtol = self.tolerances[dtype]
        layer = spec.layers[layer_idx]
        got = out.detach().double().cpu()
        expected = reference_attention(case, layer.scale, **_facts(layer))
        bad, rows = _differing_sequences(case, got, expected, atol, rtol)
        if not bad:
            return
        suspect = _diagnose(case, got, layer, atol, rtol, rows)
        violation(
            f"{what}: attention output differs from the float64 reference (atol {atol}, rtol {rtol}) "
            f"for {len(bad)} of {case.batch.num_seqs} sequences: {'; '.join(bad)}."
            + (f" {suspect}." if suspect else "")
        )

    # -- tests -----------------------------------------------------------------------------
    def test_class_facts_are_consistent(self, component):
        """Device types, dtypes, head sizes and block sizes are well formed."""
        assert component.device_types and all(isinstance(d, str) for d in component.device_types), (
            f"device_types must name torch device types, got {component.device_types!r}"
        )
        for dtype in component.supported_dtypes:
            assert isinstance(getattr(torch, dtype, None), torch.dtype), (
                f"supported_dtypes entry {dtype!r} is not a torch dtype name"
            )
        sizes = component.supported_head_sizes
        assert sizes is None or (sizes and all(isinstance(n, int) and n > 0 for n in sizes)), (
            f"supported_head_sizes must be None (any) or a tuple of positive ints, got {sizes!r}"
        )
        multiple, default = component.block_size_multiple, component.default_block_size
        assert multiple >= 1 and default >= 1 and default % multiple == 0, (
            f"default_block_size {default} must be a positive multiple of block_size_multiple {multiple}"
        )

    def test_kv_cache_layout_is_consistent(self, component, target_platform):
        """``kv_cache_shape`` holds exactly K and V of every slot, ``kv_cache_bytes_per_block``
        counts at least that (the engine sizes the pool from it), ``workspace_bytes`` is a
        size and ``allocate_kv_cache`` gives one cache per layer."""
        dtype = next((d for d in self.dtypes if d in component.supported_dtypes), self.dtypes[0])
        head_dim = self.head_sizes[0]
        layers = (layer_spec(head_dim),) * 2
        spec = self.spec(target_platform, (6, 3), head_dim, dtype, component.default_block_size, layers)
        self.require_served(component, spec, target_platform)
        backend = component(spec)
        for num_blocks in (7, 1):
            shape = backend.kv_cache_shape(num_blocks)
            assert all(isinstance(n, int) for n in shape), f"kv_cache_shape returned {shape!r}, not ints"
            size = 2 * num_blocks * spec.block_size * spec.num_kv_heads * head_dim
            assert torch.Size(shape).numel() == size, (
                f"kv_cache_shape({num_blocks}) = {shape} holds {torch.Size(shape).numel()} elements; "
                f"K and V of every slot are {size}"
            )
        per_block = backend.kv_cache_bytes_per_block()
        least = torch.Size(backend.kv_cache_shape(1)).numel() * spec.cache_dtype.itemsize
        assert isinstance(per_block, int) and per_block >= least, (
            f"kv_cache_bytes_per_block() = {per_block!r}; one block of kv_cache_shape in {spec.cache_dtype} "
            f"takes {least} bytes"
        )
        workspace = backend.workspace_bytes()
        assert isinstance(workspace, int) and workspace >= 0, f"workspace_bytes() = {workspace!r}, not a size"

        num_blocks = 5
        caches = backend.allocate_kv_cache(num_blocks)
        assert len(caches) == spec.num_layers, (
            f"allocate_kv_cache gave {len(caches)} caches for a spec of {spec.num_layers} layers"
        )

    def test_matches_reference(self, component, target_platform, case: AttentionCase):
        """``write_kv`` then ``forward`` on a random paged batch equals the float64 reference."""
        spec = self.spec(target_platform, HEAD_LAYOUTS[case.layout], case.head_dim, case.dtype, case.block_size)
        self.require_served(component, spec, target_platform)
        seed = sum(map(ord, str(case)))
        (paged_case,), (out,) = self.run_case(
            component, target_platform, spec, scenario(case.scenario, case.block_size), seed
        )
        self.check_against_reference(paged_case, out, spec, str(case))

    def test_layer_facts_match_reference(self, component, target_platform, kind_case: LayerKindCase):
        """A layer's scale, sliding window and soft-cap (:data:`LAYER_KINDS`) are applied as the
        reference applies them; a window or soft-cap may instead be refused, with a reason naming it."""
        facts = LAYER_KINDS[kind_case.kind]
        head_dim, dtype, block_size = kind_case.head_dim, kind_case.dtype, kind_case.block_size
        plain = self.spec(target_platform, HEAD_LAYOUTS["gqa"], head_dim, dtype, block_size)
        self.require_served(component, plain, target_platform)
        spec = dataclasses.replace(plain, layers=(layer_spec(head_dim, **facts),))
        self.require_served_or_named(component, spec, target_platform, facts)
        seed = sum(map(ord, str(kind_case)))
        (paged_case,), (out,) = self.run_case(component, target_platform, spec, scenario("mixed", block_size), seed)
        self.check_against_reference(paged_case, out, spec, str(kind_case))

    def test_short_multi_token_queries_over_long_contexts(self, component, target_platform, lookahead_case):
        """Speculative decoding's verification step (:func:`lookahead_scenario`): queries of 1 + k
        tokens (k = 1..7) after hundreds of cached tokens, causal among their own rows, beside decodes
        and a prefill in one GQA batch; with the default layer and with a sliding window and soft-cap
        (which a backend may refuse, naming them)."""
        facts = LOOKAHEAD_KINDS[lookahead_case.kind]
        head_dim, block_size = self.head_sizes[0], component.default_block_size
        plain = self.spec(target_platform, HEAD_LAYOUTS["gqa"], head_dim, lookahead_case.dtype, block_size)
        self.require_served(component, plain, target_platform)
        spec = dataclasses.replace(plain, layers=(layer_spec(head_dim, **facts),))
        self.require_served_or_named(component, spec, target_platform, facts)
        seed = sum(map(ord, str(lookahead_case)))
        seqs = lookahead_scenario(block_size)
        (case,), (out,) = self.run_case(component, target_platform, spec, seqs, seed)
        self.check_against_reference(case, out, spec, f"1 + k token queries over long contexts ({lookahead_case})")

    def test_one_metadata_serves_every_layer(self, component, target_platform):
        """``build_metadata`` runs once per step; its result must work for every layer's cache."""
        block_size = component.default_block_size
        head_dim = self.head_sizes[0]
        layers = (layer_spec(head_dim),) * 3
        spec = self.spec(target_platform, HEAD_LAYOUTS["gqa"], head_dim, self.dtypes[0], block_size, layers)
        self.require_served(component, spec, target_platform)
        cases, outputs = self.run_case(component, target_platform, spec, scenario("mixed", block_size), seed=3)
        for layer, (case, out) in enumerate(zip(cases, outputs)):
            self.check_against_reference(case, out, spec, f"layer {layer} of 3 sharing one metadata", layer)

    def test_layers_of_different_kinds_share_one_metadata(self, component, target_platform):
        """Sliding and full layers interleaved (Gemma 3, Qwen2 with ``max_window_layers``), one
        metadata per step: each layer is computed with its own facts."""
        head_dim = self.head_sizes[0]
        local, full = layer_spec(head_dim, sliding_window=6), layer_spec(head_dim, scale=0.25)
        layers = (local, full, local)
        spec = self.spec(
            target_platform, HEAD_LAYOUTS["gqa"], head_dim, self.dtypes[0], component.default_block_size, layers
        )
        self.require_served(component, dataclasses.replace(spec, layers=(full,)), target_platform)
        self.require_served_or_named(component, spec, target_platform, {"sliding_window": 6})
        cases, outputs = self.run_case(component, target_platform, spec, scenario("mixed", spec.block_size), seed=4)
        for layer, (case, out) in enumerate(zip(cases, outputs)):
            self.check_against_reference(case, out, spec, f"layer {layer} ({spec.layers[layer]}) of 3", layer)

    def test_write_kv_stores_exactly_the_slot_mapping(self, component, target_platform, dtype):
        """``write_kv`` changes the K and V rows of the ``slot_mapping`` slots and nothing else,
        and each token's K/V lands in its own slot."""
        self.check_write_kv(component, target_platform, dtype, padded=False)

    def test_write_kv_skips_padded_tokens(self, component, target_platform):
        """Tokens whose slot is -1 (padding, e.g. up to a captured CUDA graph's size) are not stored anywhere."""
        dtype = next((d for d in self.dtypes if d in component.supported_dtypes), self.dtypes[0])
        self.check_write_kv(component, target_platform, dtype, padded=True)

    def check_write_kv(self, component, target_platform, dtype: str, padded: bool) -> None:
        """Write a mixed batch (every third token's slot -1 when ``padded``) and compare the cache, slot by slot."""
        block_size = component.default_block_size
        num_blocks = 41 if block_size == 37 else 37
        kv_heads = next(h for h in (3, 5, 6, 7) if h not in (2, num_blocks, block_size, self.head_sizes[0]))
        spec = self.spec(target_platform, (2 * kv_heads, kv_heads), self.head_sizes[0], dtype, block_size)
        self.require_served(component, spec, target_platform)
        case = make_paged_case(
            scenario("mixed", block_size), spec.num_heads, kv_heads, spec.head_dim, block_size, num_blocks, spec.dtype,
            seed=5, device=spec.device,
        )  # fmt: skip
        batch = case.batch
        if padded:
            slot_mapping = batch.slot_mapping.clone()
            slot_mapping[::3] = -1
            batch = dataclasses.replace(batch, slot_mapping=slot_mapping)
        backend = component(spec)
        cache = garbage_cache(backend.kv_cache_shape(num_blocks), spec.dtype, spec.device, 5)
        before = cache.clone()
        backend.write_kv(cache, case.key, case.value, backend.build_metadata(batch))
        target_platform.synchronize()
        slot_mapping = batch.slot_mapping.cpu().tolist()
        stored_tokens = [t for t, slot in enumerate(slot_mapping) if slot >= 0]
        changed = int((cache != before).sum())
        expected = len(stored_tokens) * 2 * kv_heads * spec.head_dim
        what = f"{len(stored_tokens)} tokens in their slot_mapping slots" + (
            f" ({len(slot_mapping) - len(stored_tokens)} padded tokens with slot -1 stored nowhere)" if padded else ""
        )
        assert changed == expected, (
            f"write_kv changed {changed} cache elements; storing K and V of {what} changes exactly {expected}"
            + (" (it wrote outside those slots)" if changed > expected else " (some K/V rows were not written)")
        )
        slots = self.kv_slots(cache, num_blocks, block_size, kv_heads, spec.head_dim)
        if slots is None:
            warnings.warn(
                f"kv cache layout {tuple(cache.shape)} not understood: override kv_slots() in "
                f"{type(self).__name__} to check where each token lands",
                pytest.PytestWarning,
                stacklevel=1,
            )
            return
        old_slots = self.kv_slots(before, num_blocks, block_size, kv_heads, spec.head_dim)
        for which, stored, new, old in [
            ("key", slots[0], case.key, old_slots[0]),
            ("value", slots[1], case.value, old_slots[1]),
        ]:
            stored, new = stored.cpu(), new.to(spec.dtype).cpu()
            for token in stored_tokens:
                slot = slot_mapping[token]
                if not torch.equal(stored[slot], new[token]):
                    found = [s for s in range(stored.shape[0]) if torch.equal(stored[s], new[token])]
                    violation(
                        f"write_kv put token {token}'s {which} in slot(s) {found or 'none'} instead of slot "
                        f"{slot} (block {slot // block_size}, offset {slot % block_size}) given by slot_mapping"
                    )
            untouched = torch.ones(stored.shape[0], dtype=torch.bool)
            untouched[[slot_mapping[t] for t in stored_tokens]] = False
            assert torch.equal(stored[untouched], old[untouched].cpu()), (
                f"write_kv changed the {which} of slots outside slot_mapping"
                + (" (a token with slot -1 must not be stored)" if padded else "")
            )

    def test_unsupported_reasons_name_what_is_refused(self, component, target_platform):
        """Refusals come as readable reasons naming the refused dtype, platform, block size and
        head counts; a configuration the backend serves gets ``[]``."""
        default_bs = component.default_block_size
        served_dtype = next((d for d in self.dtypes if d in component.supported_dtypes), None)
        if served_dtype is None:
            pytest.skip(f"the backend serves none of {self.dtypes}; set dtypes in {type(self).__name__}")
        good = self.spec(target_platform, HEAD_LAYOUTS["gqa"], self.head_sizes[0], served_dtype, default_bs)
        reasons = component.unsupported_reasons(good, target_platform)
        assert reasons == [], f"unsupported_reasons must return [] for a served configuration, got {reasons!r}"

        def refused(spec: AttentionSpec, platform: Platform, *words: str) -> None:
            got = component.unsupported_reasons(spec, platform)
            assert isinstance(got, list) and got, f"{spec} on {platform.name!r} must be refused with a reason"
            for reason in got:
                assert isinstance(reason, str) and reason.strip() and "\n" not in reason, (
                    f"each reason must be a one-line sentence, got {reason!r}"
                )
            assert any(w in r for r in got for w in words), f"no reason among {got!r} names any of {words}"

        refused(dataclasses.replace(good, dtype=torch.float64), target_platform, "float64")
        refused(good, _NowherePlatform(), "nowhere")
        refused(dataclasses.replace(good, num_heads=6, num_kv_heads=4), target_platform, "6", "4")
        if component.block_size_multiple > 1:
            odd = component.block_size_multiple + 1
            refused(dataclasses.replace(good, block_size=odd), target_platform, str(odd))

    def test_head_size_is_served_or_refused_with_reason(self, component, target_platform, probe_head_size):
        """A less common head size is either computed correctly or refused with a reason naming it."""
        dtype = next((d for d in self.dtypes if d in component.supported_dtypes), self.dtypes[0])
        spec = self.spec(target_platform, HEAD_LAYOUTS["gqa"], probe_head_size, dtype, component.default_block_size)
        reasons = component.unsupported_reasons(spec, target_platform)
        if reasons:
            assert any(str(probe_head_size) in r for r in reasons), (
                f"head size {probe_head_size} is refused, but no reason names it: {reasons!r}"
            )
            return
        (case,), (out,) = self.run_case(
            component, target_platform, spec, scenario("mixed", spec.block_size), seed=probe_head_size
        )
        self.check_against_reference(case, out, spec, f"head size {probe_head_size}")

    # -- layouts, scales and pools as the engine uses them ----------------------------------
    def test_strided_qkv_views(self, component, target_platform, dtype):
        """``query``/``key``/``value`` are non-contiguous views into one fused qkv tensor, as the
        Llama model slices its projection: the backend must honour their strides."""
        spec = self.spec(target_platform, HEAD_LAYOUTS["gqa"], self.head_sizes[0], dtype, component.default_block_size)
        self.require_served(component, spec, target_platform)
        seqs = scenario("mixed", spec.block_size)
        (case,), (out,) = self.run_case(component, target_platform, spec, seqs, seed=11, transform=fused_qkv_views)
        assert not case.query.is_contiguous() and not case.key.is_contiguous()
        self.check_against_reference(case, out, spec, "q/k/v as strided views of a fused qkv tensor")

    def test_block_ids_near_the_end_of_a_large_pool(self, component, target_platform):
        """Block tables holding the last ids of a large pool (slot offsets past 2**23 elements)."""
        spec = self.spec(
            target_platform, HEAD_LAYOUTS["mqa"], self.head_sizes[0], self.dtypes[0], component.default_block_size
        )
        self.require_served(component, spec, target_platform)
        pool = max(LARGE_POOL_SLOTS // spec.block_size, 64)
        seqs = scenario("mixed", spec.block_size)
        transform = at_end_of_pool(pool)
        (case,), (out,) = self.run_case(
            component, target_platform, spec, seqs, seed=13, num_blocks=pool, transform=transform
        )
        assert max(max(t) for t in case.tables) == pool - 1
        self.check_against_reference(case, out, spec, f"block ids up to {pool - 1} of a pool of {pool}")

    def test_many_sequences_of_very_different_lengths(self, component, target_platform, dtype):
        """64 sequences in one batch, from one token to many blocks, decodes and (chunked) prefills."""
        spec = self.spec(target_platform, HEAD_LAYOUTS["gqa"], self.head_sizes[0], dtype, component.default_block_size)
        self.require_served(component, spec, target_platform)
        seqs = many_sequences(64, spec.block_size, seed=14)
        (case,), (out,) = self.run_case(component, target_platform, spec, seqs, seed=14)
        self.check_against_reference(case, out, spec, "64 sequences of very different lengths")


LARGE_POOL_SLOTS = 1 << 17
"""Slots of the pool in :meth:`AttentionBackendContract.test_block_ids_near_the_end_of_a_large_pool`."""


def fused_qkv_views(case: PagedCase) -> PagedCase:
    """The same case with ``query``/``key``/``value`` as views into one ``[tokens, (heads + 2 *
    kv_heads) * head_dim]`` tensor (each row holds a token's q, k and v)."""
    tokens, heads, head_dim = case.query.shape
    kv_heads = case.key.shape[1]
    fused = torch.cat([case.query.flatten(1), case.key.flatten(1), case.value.flatten(1)], dim=1)
    q_end, k_end = heads * head_dim, (heads + kv_heads) * head_dim
    return dataclasses.replace(
        case,
        query=fused[:, :q_end].view(tokens, heads, head_dim),
        key=fused[:, q_end:k_end].view(tokens, kv_heads, head_dim),
        value=fused[:, k_end:].view(tokens, kv_heads, head_dim),
    )


def at_end_of_pool(pool: int) -> Callable[[PagedCase], PagedCase]:
    """A transform moving a case's blocks to the top of a ``pool``-block cache (its highest block
    becomes ``pool - 1``), keeping their order and the rest of the case."""

    def move(case: PagedCase) -> PagedCase:
        shift = pool - 1 - max(max(t) for t in case.tables)
        tables = [[b + shift for b in t] for t in case.tables]
        batch = case.batch
        context = case.context_lens
        moved = build_batch(tables, context, batch.query_lens_host, batch.block_size, batch.slot_mapping.device)
        return dataclasses.replace(case, batch=moved, tables=tables)

    return move


def many_sequences(count: int, block_size: int, seed: int) -> list[tuple[int, int]]:
    """``count`` sequences of 1 to about ``6 * block_size`` tokens: mostly decodes, every fourth a
    chunked prefill, every seventh a whole prefill (deterministic for ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6 * block_size, (count,), generator=gen).tolist()
    seqs = []
    for i, n in enumerate(lengths):
        if i % 7 == 0:
            seqs.append((0, min(n, 2 * block_size)))
        elif i % 4 == 0:
            new = min(n, 13)
            seqs.append((n - new, new))
        else:
            seqs.append((n, 1))
    return seqs


def _interpreter_on(env: dict[str, str]) -> bool:
    return bool(env) and all(os.environ.get(key) == value for key, value in env.items())


def _interpreter_unless_accelerator(env: dict[str, str], modules: tuple[str, ...]) -> None:
    """Set ``env`` (a kernel interpreter's switch) unless a platform other than the host is available:
    the knob :attr:`AttentionBackendContract.host_interpreter_env`."""
    if _interpreter_on(env):
        return
    for name in get_plugin_manager().registry("platform").names():
        try:
            platform_cls = load_component("platform", name)
        except Exception:  # a broken platform plugin is reported where it is used, not here
            continue
        if platform_cls.device_type != "cpu" and platform_cls.unavailable_reason() is None:
            return
    imported = [module for module in modules if module in sys.modules]
    if imported:
        # their kernels were defined in compiled mode: interpreted launches would fail
        switch = " ".join(f"{key}={value}" for key, value in env.items())
        raise RuntimeError(
            f"host_interpreter_env: {', '.join(imported)} was imported before {switch} could be set; set it "
            "in the environment (or a conftest.py) before anything imports it"
        )
    os.environ.update(env)


GARBAGE = 50.0
"""Around this value lie the cache entries no test wrote: far from any test K/V (standard normal)."""


def garbage_cache(shape: tuple[int, ...], dtype: torch.dtype, device: Any, seed: int) -> torch.Tensor:
    """A KV cache full of values far from any test K/V, so stray reads and writes show."""
    gen = torch.Generator().manual_seed(seed)
    return (GARBAGE + torch.randn(shape, generator=gen)).to(dtype).to(device)


def _kind(context: int, query: int) -> str:
    if query == 1 and context:
        return "decode"
    return "chunked prefill" if context else "prefill"


def _differing_sequences(case: PagedCase, got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float):
    """Descriptions of the sequences whose rows differ, and a bool mask of those rows."""
    bad = []
    rows_of_bad = torch.zeros(got.shape[0], dtype=torch.bool)
    starts = case.batch.query_start_loc_host
    for i, context in enumerate(case.context_lens):
        rows = slice(starts[i], starts[i + 1])
        err = (got[rows] - expected[rows]).abs()
        excess = err - (atol + rtol * expected[rows].abs())
        if not torch.isfinite(got[rows]).all() or (excess > 0).any():
            query = starts[i + 1] - starts[i]
            bad.append(f"#{i} {_kind(context, query)} of {query} after {context} cached (max error {err.max():.3g})")
            rows_of_bad[rows] = True
    return bad, rows_of_bad


def _facts(layer: LayerAttentionSpec) -> dict[str, Any]:
    """The reference's keyword arguments for ``layer``'s window and soft-cap."""
    return {"sliding_window": layer.sliding_window, "logits_soft_cap": layer.logits_soft_cap}


def _diagnose(
    case: PagedCase, got: torch.Tensor, layer: LayerAttentionSpec, atol: float, rtol: float, rows: torch.Tensor
) -> str | None:
    """A sentence naming the known bug that explains ``got`` on ``rows`` (those of the sequences that
    differ from the reference: a bug confined to some kind of sequence leaves the others right), if any."""
    if got.abs().max() > GARBAGE / 2:  # outputs average values: only garbage gets this large
        return (
            f"Values of never-written cache slots (garbage around {GARBAGE}) reach the output: K/V are "
            "written to or read from slots other than those of slot_mapping and the block tables"
        )
    num_heads, num_kv_heads, head_dim = case.query.shape[1], case.key.shape[1], case.query.shape[2]
    no_cache = dataclasses.replace(
        case,
        batch=dataclasses.replace(case.batch, seq_lens_host=list(case.batch.query_lens_host)),
        past_keys=[k[:0] for k in case.past_keys],
        past_values=[v[:0] for v in case.past_values],
    )
    scale = layer.scale
    suspects: list[tuple[str, PagedCase, float, dict[str, Any]]] = [
        ("the causal mask is off by one: each query also sees the next token", case, scale, {"mask_shift": 1}),
        ("the causal mask is off by one: each query misses its own token", case, scale, {"mask_shift": -1}),
        ("there is no causal mask: queries see later tokens of their sequence", case, scale, {"mask_shift": 1 << 20}),
        ("the softmax scale is ignored (1.0 is used)", case, 1.0, {}),
        ("cached tokens are ignored: queries attend only to this step's tokens", no_cache, scale, {}),
    ]
    if scale != head_dim**-0.5:
        suspects.append(("the layer's scale is ignored (head_dim ** -0.5 is used)", case, head_dim**-0.5, {}))
    if layer.sliding_window is not None:
        suspects += [
            ("the sliding window is ignored: queries see every earlier key", case, scale, {"sliding_window": None}),
            (
                "the sliding window is off by one: each query also sees the key sliding_window positions back",
                case, scale, {"window_shift": 1},
            ),
            ("the sliding window is off by one: each query misses the oldest key of its window", case, scale,
             {"window_shift": -1}),
        ]  # fmt: skip
    if layer.logits_soft_cap is not None:
        suspects.append(("the logits soft-cap is ignored", case, scale, {"logits_soft_cap": None}))
    if 1 < num_kv_heads < num_heads:
        suspects.append(
            (
                "GQA maps query head h to KV head h % num_kv_heads instead of h // (num_heads // num_kv_heads)",
                case,
                scale,
                {"kv_head_of": torch.arange(num_heads) % num_kv_heads},
            )
        )
    for description, suspect_case, suspect_scale, variant in suspects:
        expected = reference_attention(suspect_case, suspect_scale, **{**_facts(layer), **variant})
        if torch.allclose(got[rows], expected[rows], atol=atol, rtol=rtol):
            return f"The output matches a reference in which {description}"
    return None
