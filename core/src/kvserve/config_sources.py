"""Where an ``EngineConfig`` comes from: a YAML/TOML file, ``KVSERVE_*`` env vars, command-line values.

Later sources win: defaults < ``--config FILE`` < environment < command line. Every source
speaks the flat field names of :meth:`EngineConfig.from_flat` (``max_num_seqs``, ``port``);
a file may also group them under section names (``server: {port: 8001}``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kvserve.config import FLAT_FIELDS, EngineConfig
from kvserve.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ENV_PREFIX = "KVSERVE_"


def load_config(
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> EngineConfig:
    """Merge the file, the environment (``os.environ`` by default) and ``overrides`` (None values skipped)."""
    return EngineConfig.from_flat(**config_fields(config_file, overrides, environ))


def config_fields(
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The merged flat fields of :func:`load_config`, unvalidated (for ``LLM(**fields)``)."""
    fields: dict[str, Any] = read_config_file(config_file) if config_file is not None else {}
    fields.update(env_fields(os.environ if environ is None else environ))
    fields.update({name: value for name, value in (overrides or {}).items() if value is not None})
    return fields


def read_config_file(path: Path) -> dict[str, Any]:
    """Flat fields from a ``.yaml``/``.yml`` or ``.toml`` file; errors name the file."""
    suffix = path.suffix.lower()
    try:
        text = path.read_text()
        if suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"config file {path}: unknown format {suffix!r}; use .yaml, .yml or .toml")
    except (OSError, yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of config fields, got {type(data).__name__}")
    return _flatten(data)


def env_fields(environ: Mapping[str, str]) -> dict[str, str]:
    """``KVSERVE_MAX_NUM_SEQS=8`` -> ``{"max_num_seqs": "8"}``; only names of config fields are read,
    so unrelated variables such as ``KVSERVE_LOG_LEVEL`` are left alone. Pydantic parses the strings."""
    return {name: environ[key] for name in FLAT_FIELDS if (key := env_var(name)) in environ}


def env_var(field: str) -> str:
    """The environment variable of a flat config field: ``max_num_seqs`` -> ``KVSERVE_MAX_NUM_SEQS``."""
    return ENV_PREFIX + field.upper()


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """``["max_num_seqs=8"]`` (command-line ``--set``) -> ``{"max_num_seqs": "8"}``."""
    fields = {}
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set {assignment!r}: expected FIELD=VALUE, e.g. max_num_seqs=8")
        fields[name.strip().replace("-", "_")] = value
    return fields


def _flatten(data: dict[str, Any]) -> dict[str, Any]:
    # A section name can also be a field name (``model``, ``scheduler``): a mapping is the section.
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in EngineConfig.model_fields and isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    return flat
