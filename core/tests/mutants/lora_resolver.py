"""Deliberately broken copies of core's ``filesystem`` LoRA resolver: each breaks one rule of the
resolver contract.

Test fixtures for ``core/tests/test_lora_resolver_contract_mutants.py``, which asserts that the contract
fails each of them with a message naming the broken behaviour.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvserve.lora.filesystem_resolver import FilesystemResolver
from kvserve.lora.request import LoRARequest


class NamedByPath(FilesystemResolver):
    """Names the adapter after its directory's path instead of the name asked for."""

    name = "filesystem_named_by_path"

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        found = await super().resolve_lora(base_model_name, lora_name)
        return None if found is None else LoRARequest(found.lora_path, 1, found.lora_path)


class ReadsBeforeLooking(FilesystemResolver):
    """Opens the adapter's config without checking that it is there: an unknown name raises."""

    name = "filesystem_reads_before_looking"

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        folder = Path(self.config.lora_resolver_cache_dir) / lora_name
        json.loads((folder / "adapter_config.json").read_text())
        return await super().resolve_lora(base_model_name, lora_name)


class FollowsPaths(FilesystemResolver):
    """Joins the name to the folder unchecked: ``../outside`` and absolute paths resolve."""

    name = "filesystem_follows_paths"

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        folder = Path(self.config.lora_resolver_cache_dir) / lora_name
        if lora_name and (folder / "adapter_config.json").is_file():
            return LoRARequest(lora_name, 1, str(folder))
        return None


class AnyFolder(FilesystemResolver):
    """Takes any subfolder for an adapter, one without ``adapter_config.json`` too."""

    name = "filesystem_any_folder"

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        folder = Path(self.config.lora_resolver_cache_dir) / lora_name
        if Path(lora_name).name == lora_name and lora_name not in ("", ".", "..") and folder.is_dir():
            return LoRARequest(lora_name, 1, str(folder))
        return None


class FirstAdapterAlways(FilesystemResolver):
    """Answers every known name with the store's first adapter (a cache keyed by nothing)."""

    name = "filesystem_first_adapter_always"

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        found = await super().resolve_lora(base_model_name, lora_name)
        if found is None:
            return None
        first = sorted(p for p in Path(self.config.lora_resolver_cache_dir).iterdir() if p.name != "not-an-adapter")[0]
        return LoRARequest(lora_name, 1, str(first))


class Blocking(FilesystemResolver):
    """A plain ``def``: the server cannot await it."""

    name = "filesystem_blocking"

    def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:  # type: ignore[override]
        folder = Path(self.config.lora_resolver_cache_dir) / lora_name
        return LoRARequest(lora_name, 1, str(folder)) if (folder / "adapter_config.json").is_file() else None
