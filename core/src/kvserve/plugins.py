"""Plugin discovery: entry points in the ``kvserve`` group, loaded once per process."""

from __future__ import annotations

import importlib.metadata as md
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import pluggy

from kvserve import hookspecs
from kvserve.errors import UnknownComponentError
from kvserve.registry import Registration, Registry

ENTRY_POINT_GROUP = "kvserve"
KINDS = (
    "platform",
    "attention_backend",
    "model",
    "scheduler",
    "kv_cache_manager",
    "quantization_method",
    "logits_processor",
    "structured_output_backend",
    "tool_parser",
    "reasoning_parser",
    "gguf_architecture",
    "proposer",
    "lora_resolver",
)


@dataclass
class PluginInfo:
    """One entry point: where it comes from and whether it loaded."""

    name: str
    package: str
    version: str
    status: str  # "loaded", "disabled" or "failed: <error>"


def _env_names(var: str) -> set[str] | None:
    value = os.environ.get(var, "").strip()
    return {v.strip() for v in value.split(",") if v.strip()} if value else None


class PluginManager:
    """Discovers plugins and holds one :class:`Registry` per kind.

    ``KVSERVE_PLUGINS`` (comma-separated plugin or package names) is an allowlist;
    ``KVSERVE_DISABLE_PLUGINS`` a blocklist. Core's built-ins always load.
    """

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("kvserve")
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.registries: dict[str, Registry[Any]] = {kind: Registry(kind) for kind in KINDS}

    def discover(self) -> None:
        """Import every allowed entry point; a failing one is recorded, not raised."""
        allow = _env_names("KVSERVE_PLUGINS")
        deny = _env_names("KVSERVE_DISABLE_PLUGINS") or set()
        for ep in sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = ep.dist
            package, version = (dist.name, dist.version) if dist else ("?", "?")
            names = {ep.name, package}
            builtin = package == "kvserve-core"
            if not builtin and ((allow is not None and not names & allow) or names & deny):
                self.plugins[ep.name] = PluginInfo(ep.name, package, version, "disabled")
                continue
            try:
                module = ep.load()
            except Exception as exc:  # any import failure must not take down the other plugins
                self.plugins[ep.name] = PluginInfo(ep.name, package, version, f"failed: {exc!r}")
                continue
            self.add_plugin(module, ep.name, package, version)

    def add_plugin(self, module: object, name: str, package: str, version: str) -> None:
        """Register an already imported plugin module (used by discovery and by tests).

        Its components are added only if every one of its ``register_*`` hooks returns; a hook
        that raises marks the plugin failed (naming the hook) and leaves every other plugin as it was.
        """
        try:
            self.pm.register(module, name=name)  # pluggy checks the hook signatures here
        except Exception as exc:
            self.plugins[name] = PluginInfo(name, package, version, f"failed: {exc!r}")
            return
        registrations: list[Registration] = []
        for kind in KINDS:
            hook = f"register_{kind}s"
            for impl in getattr(self.pm.hook, hook).get_hookimpls():
                if impl.plugin_name != name:
                    continue
                try:
                    impl.function(register=self._register_callback(kind, name, package, version, registrations))
                except Exception as exc:  # a broken plugin must not take down the others
                    self.pm.unregister(module, name=name)
                    self.plugins[name] = PluginInfo(name, package, version, f"failed: {hook} raised {exc!r}")
                    return
        self.plugins[name] = PluginInfo(name, package, version, "loaded")
        for registration in registrations:
            self.registries[registration.kind].add(registration)

    @staticmethod
    def _register_callback(kind: str, plugin: str, package: str, version: str, into: list[Registration]):
        def register(name: str, target: str, api_version: int = 1, **facts: Any):
            into.append(Registration(kind, name, target, plugin, package, version, api_version, facts))

        return register

    def registry(self, kind: str) -> Registry[Any]:
        return self.registries[kind]

    def failed_plugins(self) -> str:
        """A one-line summary of the plugins that failed to import or register ("" when none did)."""
        failed = [p for p in self.plugins.values() if p.status.startswith("failed")]
        return "; ".join(f"{p.name!r} (package {p.package}) {p.status}" for p in failed)


@cache
def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager (discovery runs once per process)."""
    manager = PluginManager()
    manager.discover()
    return manager


def load_component(kind: str, name: str) -> Any:
    """Import a registered component; a not-found error also names plugins that failed to load."""
    manager = get_plugin_manager()
    try:
        return manager.registry(kind).load(name)
    except UnknownComponentError as exc:
        failed = manager.failed_plugins()
        if failed:
            raise UnknownComponentError(f"{exc}; plugins that failed to load: {failed}") from exc
        raise
