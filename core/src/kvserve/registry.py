"""A typed registry of lazily imported components, one per plugin kind."""

from __future__ import annotations

import importlib
import importlib.metadata as md
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kvserve.errors import PluginError, UnknownComponentError

T = TypeVar("T")

PLUGIN_API_VERSION = 1
"""The plugin API this core implements; a registration written for another version is refused."""

DISTRIBUTION_FAMILIES = {
    "platform": "platform",
    "attention_backend": "attention",
    "model": "models",
    "scheduler": "scheduler",
    "quantization_method": "quant",
    "structured_output_backend": "structured-outputs",
    "gguf_architecture": "models",
    "proposer": "proposer",
}
"""The naming convention of kvserve's plugin distributions, per kind: ``kvserve-<family>-<name>``
(``kvserve-attention-flash-attn`` registers the attention backend ``flash_attn``; a model
distribution is named by its model family). The kinds left out are core's built-ins' alone."""

DEFAULT_SET = "kvserve"
"""The meta-distribution that installs core with the default plugin set."""


def plugin_distributions() -> list[str]:
    """The installed distributions that declare kvserve plugins (entry points in the ``kvserve`` group),
    whether or not they are enabled or loaded: read from package metadata, nothing is imported."""
    return sorted({ep.dist.name for ep in md.entry_points(group="kvserve") if ep.dist is not None})


def install_hint(kind: str, name: str | None = None) -> str:
    """What to install for a component of ``kind`` (named ``name``, or any when None), from the installed
    packages' metadata and the naming convention (:data:`DISTRIBUTION_FAMILIES`); "" when nothing is known."""
    family = DISTRIBUTION_FAMILIES.get(kind)
    if family is None:
        return ""
    prefix = f"kvserve-{family}-"
    if name is not None:
        if kind in ("model", "gguf_architecture"):
            return f"install the model plugin that implements it (kvserve's are named {prefix}<model family>)"
        return f"if {name!r} is one of kvserve's plugins: pip install {prefix}{name.replace('_', '-')}"
    present = [dist for dist in plugin_distributions() if dist.startswith(prefix)]
    if present:
        # Installed, but disabled (KVSERVE_PLUGINS, KVSERVE_DISABLE_PLUGINS) or failed to import.
        return f"pip install {present[0]} (installed here but not loaded: {', '.join(present)})"
    return f"install a {prefix}<name> plugin (pip install {DEFAULT_SET}: core with the default plugins)"


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
            hint = install_hint(self.kind)
            kind = self.kind.replace("_", " ")
            raise UnknownComponentError(f"no {kind} plugin installed" + (f": {hint}" if hint else ""))
        reg = self._entries.get(name)
        if reg is None:
            available = ", ".join(sorted(self._entries)) or "none"
            hint = install_hint(self.kind, name)
            kind = self.kind.replace("_", " ")
            raise UnknownComponentError(
                f"unknown {kind} {name!r}; available: {available}" + (f"; {hint}" if hint else "")
            )
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
