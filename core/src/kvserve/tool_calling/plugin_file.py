"""``--tool-parser-plugin FILE``: tool parsers from a Python file, without a package.

Every :class:`~kvserve.interfaces.ToolParser` subclass the file defines (not abstract) is registered
under its ``name``, as an installed plugin's would be, so ``--tool-call-parser`` can choose it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path

from kvserve import hookimpl
from kvserve.errors import ConfigError
from kvserve.interfaces.tool_parser import ToolParser
from kvserve.plugins import get_plugin_manager


class _FileParsers:
    """A plugin registering the parsers of one module."""

    def __init__(self, module: str, classes: list[type[ToolParser]]) -> None:
        self.module, self.classes = module, classes

    @hookimpl
    def register_tool_parsers(self, register) -> None:
        for cls in self.classes:
            register(cls.name, f"{self.module}:{cls.__qualname__}")


def load_tool_parser_file(path: str) -> list[str]:
    """Import ``path`` and register its tool parsers (once per process); returns their names."""
    file = Path(path).expanduser().resolve()
    plugin = f"file:{file}"
    module_name = f"kvserve_tool_parser_file_{hashlib.sha1(str(file).encode()).hexdigest()[:12]}"
    manager = get_plugin_manager()
    if plugin not in manager.plugins:
        if not file.is_file():
            raise ConfigError(f"tool_parser_plugin: no file {str(file)!r}")
        spec = importlib.util.spec_from_file_location(module_name, file)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:  # the file's own error, whatever it is
            del sys.modules[module_name]
            raise ConfigError(f"tool_parser_plugin: importing {str(file)!r} failed: {exc!r}") from exc
        classes = [
            cls
            for cls in vars(module).values()
            if isinstance(cls, type)
            and issubclass(cls, ToolParser)
            and cls.__module__ == module_name
            and not inspect.isabstract(cls)
        ]
        if not classes:
            raise ConfigError(f"tool_parser_plugin: {str(file)!r} defines no ToolParser subclass")
        manager.add_plugin(_FileParsers(module_name, classes), plugin, str(file), "file")
        if manager.plugins[plugin].status != "loaded":
            raise ConfigError(f"tool_parser_plugin: {str(file)!r} {manager.plugins[plugin].status}")
    registry = manager.registry("tool_parser")
    return [entry.name for entry in registry.entries() if entry.plugin == plugin]
