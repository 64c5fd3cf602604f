"""The engine's ``logits_processors`` config, resolved to LogitsProcessor classes."""

from __future__ import annotations

import importlib
from typing import Any

from kvserve.errors import ConfigError
from kvserve.interfaces.logits_processor import LogitsProcessor
from kvserve.plugins import load_component


def resolve_logits_processors(entries: list[Any]) -> list[type[LogitsProcessor]]:
    """Each entry of ``logits_processors`` as its class: a registered ``logits_processor`` plugin name,
    a ``"module:Class"`` string, or a class. A ConfigError names the entry that is none of these."""
    classes = []
    for index, entry in enumerate(entries):
        where = f"logits_processors[{index}]"
        if isinstance(entry, str) and ":" in entry:
            module, _, attr = entry.partition(":")
            try:
                entry = getattr(importlib.import_module(module), attr)
            except Exception as exc:
                raise ConfigError(f"{where}: cannot import {entry!r}: {exc!r}") from None
        elif isinstance(entry, str):
            try:
                entry = load_component("logits_processor", entry)
            except Exception as exc:
                raise ConfigError(f"{where}: {exc}") from None
        if not (isinstance(entry, type) and issubclass(entry, LogitsProcessor)):
            raise ConfigError(f"{where}: {entry!r} is not a kvserve.interfaces.LogitsProcessor subclass")
        classes.append(entry)
    return classes
