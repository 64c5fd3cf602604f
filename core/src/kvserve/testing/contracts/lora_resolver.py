"""The LoRAResolver contract: each known name resolves to its own adapter, under that name; unknown names
and names that reach outside the resolver's store give None, and nothing raises."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvserve.config import ServerConfig
from kvserve.interfaces.lora_resolver import LoRAResolver
from kvserve.lora.peft_adapter import read_adapter_config
from kvserve.lora.request import LoRARequest
from kvserve.testing.contracts._base import ComponentContract, violation

BASE_MODEL = "tiny-base"
"""The served model name the contract asks with."""
HIDDEN = 8
"""Input and output features of the written adapters' one module."""


def write_adapter(folder: Path, rank: int) -> Path:
    """A PEFT LoRA adapter of rank ``rank`` on one ``q_proj`` in ``folder`` (config and weights)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    config = {
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj"], "bias": "none",
        "base_model_name_or_path": BASE_MODEL,
    }  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(config))
    module = "base_model.model.model.layers.0.self_attn.q_proj"
    weights = {
        f"{module}.lora_A.weight": torch.zeros(rank, HIDDEN),
        f"{module}.lora_B.weight": torch.zeros(HIDDEN, rank),
    }
    save_file(weights, folder / "adapter_model.safetensors")
    return folder


class LoRAResolverContract(ComponentContract):
    """Every lora_resolver plugin must pass this. Subclass it and name the resolver::

        class TestMyResolver(LoRAResolverContract):
            lora_resolver = "my_resolver"

            def make_resolver(self, component, store):  # if it does not read lora_resolver_cache_dir
                upload(store, my_bucket)
                return component(ServerConfig(...))

    The contract writes a store, a folder holding one PEFT adapter per :meth:`adapter_names` (each of
    its own rank), a folder that is no adapter and an adapter beside the store, and asks the resolver
    :meth:`make_resolver` builds for them.
    """

    kind = "lora_resolver"
    interface = LoRAResolver
    lora_resolver: ClassVar[str]
    """Registry name of the resolver under test."""

    # -- hooks -----------------------------------------------------------------------------
    def adapter_names(self) -> Sequence[str]:
        """The names of the store's adapters."""
        return ("sql", "chat-v2", "Ünïcode.adapter_3")

    def make_resolver(self, component: type[LoRAResolver], store: Path) -> LoRAResolver:
        """The resolver under test, finding the adapters of ``store`` (a subfolder per name). By default it
        is built as the server builds it, ``component(ServerConfig(lora_resolver_cache_dir=store))``;
        override it for a resolver that looks elsewhere (copy the store there first)."""
        return component(ServerConfig(lora_resolver_cache_dir=str(store)))

    # -- fixtures and helpers ----------------------------------------------------------------
    @pytest.fixture
    def store(self, tmp_path: Path) -> Path:
        store = tmp_path / "store"
        for rank, name in enumerate(self.adapter_names(), start=1):
            write_adapter(store / name, rank)
        (store / "not-an-adapter").mkdir()
        write_adapter(tmp_path / "outside", 7)
        return store

    @pytest.fixture
    def resolver(self, component: type[LoRAResolver], store: Path) -> LoRAResolver:
        return self.make_resolver(component, store)

    @staticmethod
    def resolve(resolver: LoRAResolver, name: str) -> Any:
        """``resolver.resolve_lora(BASE_MODEL, name)``, run to its end; an exception is a violation."""
        try:
            answer = resolver.resolve_lora(BASE_MODEL, name)
            if not inspect.isawaitable(answer):
                violation(f"{type(resolver).__name__}.resolve_lora is not an async def: it returned {answer!r}")
            return asyncio.run(answer)
        except Exception as exc:
            violation(f"resolve_lora({BASE_MODEL!r}, {name!r}) raised {type(exc).__name__}: {exc}")

    def _assert_none(self, resolver: LoRAResolver, names: Sequence[str], why: str) -> None:
        for name in names:
            found = self.resolve(resolver, name)
            if found is not None:
                violation(f"resolve_lora of {name!r} ({why}) gave {found!r}; it must give None")

    # -- the contract --------------------------------------------------------------------------
    def test_resolve_lora_is_a_coroutine_function(self, component):
        """The server awaits it on its event loop."""
        if not inspect.iscoroutinefunction(component.resolve_lora):
            violation(f"{component.__name__}.resolve_lora is not an async def: the server awaits it")

    def test_known_names_resolve_to_their_own_adapter(self, resolver):
        """A LoRARequest named as asked, whose directory holds that adapter (its own rank)."""
        for rank, name in enumerate(self.adapter_names(), start=1):
            found = self.resolve(resolver, name)
            if not isinstance(found, LoRARequest):
                violation(f"resolve_lora of the store's adapter {name!r} gave {found!r}, not a LoRARequest")
            if found.lora_name != name:
                violation(f"resolve_lora of {name!r} answered the name {found.lora_name!r}; it must be {name!r}")
            try:
                config = read_adapter_config(found)
            except ValueError as exc:
                violation(f"resolve_lora of {name!r} gave lora_path {found.lora_path!r}, no adapter: {exc}")
            if config["r"] != rank:
                violation(f"resolve_lora of {name!r} gave another adapter's directory ({found.lora_path!r})")

    def test_unknown_names_give_none(self, resolver):
        """Names the store lacks, and a folder of it that holds no adapter."""
        self._assert_none(resolver, ["missing", "sql-v2", "not-an-adapter"], "not an adapter of the store")

    def test_names_reaching_outside_the_store_give_none(self, resolver, store):
        """A request's model name is the client's: it must not open any folder it names."""
        outside = store.parent / "outside"
        names = ["../outside", f"sql/../../{outside.name}", str(outside), "", ".", ".."]
        self._assert_none(resolver, names, "a path reaching outside the store")
