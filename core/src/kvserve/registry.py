"""A typed registry of lazily imported components, one per plugin kind."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kvserve.errors import PluginError, UnknownComponentError

T = TypeVar("T")

PLUGIN_API_VERSION = 1
"""The plugin API this core implements; a registration written for another version is refused."""

# Suggested distribution per kind, for "nothing of this kind is installed" errors.
INSTALL_HINTS = {
    "platform": "kvserve-platform-cpu",
    "attention_backend": "kvserve-attention-cpu",
    "model": "kvserve-models-llama",
    "scheduler": "kvserve-scheduler-fifo",
    "kv_cache_manager": "kvserve-core",
    "quantization_method": "kvserve-quant-awq",
    "logits_processor": "kvserve-core",
    "structured_output_backend": "kvserve-structured-outputs-xgrammar",
    "tool_parser": "kvserve-core",
    "reasoning_parser": "kvserve-core",
    "proposer": "kvserve-core",
}


@dataclass
class Registration:
    """One component a plugin registered: what to import, who registered it, and cheap facts."""

    kind: str
    name: str
    target: str
    plugin: str
    package: str
    version: str
    api_version: int
    facts: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # set when the registration is unusable; selecting it raises this

    @property
    def priority(self) -> int:
        return int(self.facts.get("priority", 0))

    def describe(self) -> str:
        return f"{self.kind} {self.name!r} from plugin {self.plugin!r} (package {self.package} {self.version})"


class Registry(Generic[T]):
    """Components of one kind by name; each is imported the first time it is loaded."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Registration] = {}
        self._loaded: dict[str, T] = {}

    def add(self, reg: Registration) -> None:
        """Record a registration; a second one under the same name marks the name conflicted."""
        if reg.api_version != PLUGIN_API_VERSION:
            reg.problem = (
                f"{reg.describe()} was written for plugin API version {reg.api_version}, "
                f"but kvserve-core implements version {PLUGIN_API_VERSION}; upgrade {reg.package} or kvserve-core"
            )
        existing = self._entries.get(reg.name)
        if existing is not None:
            existing.problem = reg.problem = (
                f"{self.kind} {reg.name!r} is registered twice: by package {existing.package} "
                f"(plugin {existing.plugin!r}) and by package {reg.package} (plugin {reg.plugin!r}); "
                f"uninstall one or disable one with KVSERVE_DISABLE_PLUGINS"
            )
            return
        self._entries[reg.name] = reg

    def names(self) -> list[str]:
        """Usable names, highest priority first."""
        usable = [r for r in self._entries.values() if r.problem is None]
        return [r.name for r in sorted(usable, key=lambda r: -r.priority)]

    def entries(self) -> list[Registration]:
        return list(self._entries.values())

    def get(self, name: str) -> Registration:
        """The registration of ``name``; raises a PluginError listing the alternatives."""
        if not self._entries:
            raise UnknownComponentError(
                f"no {self.kind.replace('_', ' ')} plugin installed: pip install {INSTALL_HINTS[self.kind]}"
            )
        reg = self._entries.get(name)
        if reg is None:
            available = ", ".join(sorted(self._entries)) or "none"
            raise UnknownComponentError(f"unknown {self.kind.replace('_', ' ')} {name!r}; available: {available}")
        if reg.problem:
            raise PluginError(reg.problem)
        return reg

    def load(self, name: str) -> T:
        """Import and return the object registered as ``name``."""
        if name in self._loaded:
            return self._loaded[name]
        reg = self.get(name)
        module_name, _, attr = reg.target.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # report any import failure against the package that caused it
            raise PluginError(f"{reg.describe()} failed to load {reg.target!r}: {exc!r}") from exc
        self._loaded[name] = obj
        return obj
