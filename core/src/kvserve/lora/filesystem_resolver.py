"""The built-in ``filesystem`` LoRA resolver, as vLLM's: adapters are the subdirectories of one folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kvserve.interfaces.lora_resolver import LoRAResolver
from kvserve.lora.request import LoRARequest


class FilesystemResolver(LoRAResolver):
    """``<lora_resolver_cache_dir>/<lora_name>/adapter_config.json``: the adapter named ``lora_name``.

    The folder is ``lora_resolver_cache_dir`` (``KVSERVE_LORA_RESOLVER_CACHE_DIR``); unset, nothing
    resolves. Unlike vLLM's it does not compare the adapter's ``base_model_name_or_path`` with the
    served name (a served name is seldom the path an adapter was trained from): the server checks the
    weights against the model when it loads them.
    """

    name = "filesystem"

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        """The subdirectory ``lora_name`` if it holds an ``adapter_config.json``; None otherwise, and for a
        name that is not one plain directory name."""
        root = self.config.lora_resolver_cache_dir
        if root is None or lora_name in ("", ".", "..") or Path(lora_name).name != lora_name or "\\" in lora_name:
            return None
        folder = Path(root) / lora_name
        if not await asyncio.to_thread((folder / "adapter_config.json").is_file):
            return None
        return LoRARequest(lora_name, 1, str(folder), base_model_name)
