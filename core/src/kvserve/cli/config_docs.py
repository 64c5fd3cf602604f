"""docs/configuration.md, rendered from the config model and the ``kvserve`` command line themselves.

``python -m kvserve.cli.config_docs docs/configuration.md`` (``make docs``) writes the page;
core/tests/test_config_docs.py fails when it differs from :func:`render`.

The command line is read from the typer app as users get it: a command reads the engine config when
it has ``--config``, and an option of such a command sets the config field its parameter is named
after (``max_num_seqs: ... = None`` is ``--max-num-seqs``), as the command hands it on to
:func:`~kvserve.cli.options.resolve_fields` by that name.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import typer
from pydantic import BaseModel, ByteSize, SecretStr
from pydantic.fields import FieldInfo
from typer.core import TyperGroup

from kvserve.cli.app import app, load_commands
from kvserve.config import FLAT_FIELDS, EngineConfig
from kvserve.config_sources import ENV_PREFIX, env_var

OTHER_ENV_VARS = {
    "KVSERVE_LOG_LEVEL": "Level of the `kvserve` logger (default `INFO`); `kvserve serve --log-level` is uvicorn's",
    "KVSERVE_STATS_INTERVAL": "Seconds between the engine's throughput and KV cache log lines (default 5)",
    "KVSERVE_PLUGINS": "Comma-separated plugin or package names: only these plugins load (core's built-ins always do)",
    "KVSERVE_DISABLE_PLUGINS": "Comma-separated plugin or package names that do not load",
    "KVSERVE_CACHE_DIR": "Where the testing kit and the benchmarks keep the embedded SmolLM2 converted to an HF "
    "directory (for what reads only HF checkpoints); default: the user cache directory",
    "KVSERVE_NATIVE_CACHE": "Where plugins' built C++ operator libraries are kept; default: the user cache directory",
    "KVSERVE_LORA_KERNEL": "The platform's LoRA kernel by a name its platform documents (docs/lora.md), or `torch` "
    "(core's PyTorch kernel); unset: the platform's best",
}
"""The ``KVSERVE_*`` variables that are not config fields (the test finds every one the code reads)."""

PAGE_COMMAND = "make docs"

INTRO = """\
# Configuration

<!-- Generated from kvserve/config.py and the kvserve command line by `{command}`
(python -m kvserve.cli.config_docs docs/configuration.md); core/tests/test_config_docs.py fails when
this page and the code differ. Edit the code, not this page. -->

One validated pydantic model, `kvserve.config.EngineConfig`, configures the engine and the server.
Its fields are grouped in sections (`scheduler`, `cache`, `server`, ...), but every field name is unique
across sections, so each source names fields flat: `max_num_seqs`, not `scheduler.max_num_seqs`. A bad
value fails at start with the field's name (`invalid engine config: scheduler.max_num_seqs: ...`).

## Where configuration comes from

**Python.** `LLM(...)` takes the fields as keyword arguments; `EngineConfig` takes them by section,
or flat through `EngineConfig.from_flat`. Neither reads files or the environment:
`kvserve.config_sources.load_config(path, overrides)` merges those as the command line does.

```python
from kvserve import LLM
from kvserve.config import EngineConfig

llm = LLM(max_num_seqs=8, enable_prefix_caching=False)
config = EngineConfig(scheduler={{"max_num_seqs": 8}})  # the same as EngineConfig.from_flat(max_num_seqs=8)
```

**A file**, YAML (`.yaml`, `.yml`) or TOML (`.toml`), given as `--config FILE`: fields flat, or grouped
under their section's name (a section name whose value is a mapping is the section: `model: ./dir`
is the `model` field, `model: {{seed: 1}}` the section).

```yaml
# kvserve.yaml
max_model_len: 2048
scheduler:
  max_num_seqs: 64
server:
  port: 8001
```

```toml
# kvserve.toml
max_model_len = 2048

[server]
port = 8001
```

**Environment variables**: `{prefix}` and the field's name in capitals, read by the commands below
(not by `LLM` or `EngineConfig`). Only names of config fields are read, and the text is parsed as the
field's type: booleans as `true`/`false`, `1`/`0`, `on`/`off`; sizes as a number of bytes or as `2GiB`;
`structured_outputs_config`, `speculative_config` and `override_generation_config` as JSON. A list
(`logits_processors`) cannot come from the environment or `--set`: use Python or a file. `KVSERVE_API_KEY=`
(set but empty) means no key.

```bash
KVSERVE_MAX_NUM_SEQS=64 KVSERVE_API_KEY=sk-local kvserve serve
```

**Command-line flags** of the commands that build an engine ({config_commands}): `--set FIELD=VALUE`
(or `-o`, repeatable) sets any field, and some fields have a flag of their own (the *Flag* column
below). `kvserve chat` builds one only with `--local`.

```bash
kvserve serve ./my-model --config kvserve.yaml --port 8002 -o enable_prefix_caching=false
```

## Precedence

Later sources win: defaults < `--config` file < `{prefix}*` environment < `--set` < a field's own
flag. A flag that is not given counts as not set, so `-o max_num_seqs=8` stands when `--max-num-seqs`
is left out.
"""


def render() -> str:
    """The whole page."""
    commands = list(cli_commands())
    config_commands = [c for c in commands if c.reads_config]
    parts = [
        INTRO.format(
            command=PAGE_COMMAND,
            prefix=ENV_PREFIX,
            config_commands=", ".join(f"`kvserve {c.path}`" for c in config_commands),
        ),
        "## Config fields\n",
        "Grouped by section, as `EngineConfig` holds them. *Flag* names the commands that have it; "
        "every field can also be set with `--set FIELD=VALUE`.\n",
    ]
    for section, info in EngineConfig.model_fields.items():
        parts.append(_section(section, info.annotation, config_commands))  # type: ignore[arg-type]
    parts.append(_commands_part(commands))
    parts.append(_other_env_vars())
    return "\n".join(parts)


@dataclass
class CliCommand:
    path: str  # "bench throughput"
    command: Any  # typer's click command

    @property
    def params(self) -> list[Any]:
        return [p for p in self.command.params if p.name != "help"]

    @property
    def reads_config(self) -> bool:
        return any("--config" in p.opts for p in self.params)

    def field_params(self) -> list[Any]:
        return [p for p in self.params if self.reads_config and p.name in FLAT_FIELDS]

    def other_params(self) -> list[Any]:
        fields = self.field_params()
        return [p for p in self.params if p not in fields]


def cli_commands() -> Iterator[CliCommand]:
    """Every ``kvserve`` command in ``kvserve --help`` order, a group that runs on its own included."""
    load_commands()

    def walk(group: TyperGroup, prefix: str) -> Iterator[CliCommand]:
        for name, command in group.commands.items():
            path = f"{prefix}{name}"
            if isinstance(command, TyperGroup):
                if command.invoke_without_command:
                    yield CliCommand(path, command)
                yield from walk(command, f"{path} ")
            else:
                yield CliCommand(path, command)

    yield from walk(typer.main.get_command(app), "")  # type: ignore[arg-type]


def _section(section: str, model: type[BaseModel], config_commands: list[CliCommand]) -> str:
    lines = [f"### `{section}`\n"]
    if model.__doc__:
        lines.append(_text(inspect.cleandoc(model.__doc__)) + "\n")
    lines += [
        "| Field | Type | Default | Environment | Flag | Description |",
        "|---|---|---|---|---|---|",
    ]
    nested = []
    for name, field in model.model_fields.items():
        flags = _flags_of(name, config_commands)
        lines.append(
            f"| `{name}` | {_type(field)} | {_default(field)} | `{env_var(name)}` | {flags} | {_description(field)} |"
        )
        sub = _nested_model(field.annotation)
        if sub is not None:
            nested.append((name, sub))
    text = "\n".join(lines) + "\n"
    for name, sub in nested:
        text += f"\nKeys of `{name}`:\n\n| Key | Type | Default | Description |\n|---|---|---|---|\n"
        text += "".join(
            f"| `{key}` | {_type(field)} | {_default(field)} | {_description(field)} |\n"
            for key, field in sub.model_fields.items()
        )
    return text


def _flags_of(field: str, config_commands: list[CliCommand]) -> str:
    """``--max-num-seqs`` (serve, generate): each spelling of the field's flag with the commands that have it."""
    commands_by_flag: dict[str, list[str]] = {}
    for command in config_commands:
        for param in command.field_params():
            if param.name == field:
                commands_by_flag.setdefault(_flag(param), []).append(command.path)
    return "; ".join(f"{flag} ({', '.join(paths)})" for flag, paths in commands_by_flag.items()) or "–"


def _flag(param: Any) -> str:
    if param.param_type_name == "argument":
        return f"`{param.name.upper()}` argument"
    return " / ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])


def _commands_part(commands: list[CliCommand]) -> str:
    lines = [
        "## Commands\n",
        "Every option of every `kvserve` command. Options of the commands that build an engine that "
        "set a config field are listed by the field above; the tables hold the rest.\n",
    ]
    for command in commands:
        lines.append(f"### `kvserve {command.path}`\n")
        lines.append(_text(inspect.cleandoc(command.command.help or "").split("\n\n")[0]) + "\n")
        if command.reads_config:
            fields = ", ".join(f"{_flag(p)} (`{p.name}`)" for p in command.field_params())
            lines.append(f"Reads the engine config. Flags of config fields: {fields}.\n")
        others = command.other_params()
        if others:
            lines += ["| Option | Type | Default | Environment | Description |", "|---|---|---|---|---|"]
            for param in others:
                env = f"`{param.envvar}`" if param.envvar else ""
                lines.append(
                    f"| {_flag(param)} | {_param_type(param)} | {_param_default(param)} | {env} | "
                    f"{_text(param.help or '')} |"
                )
            lines.append("")
    return "\n".join(lines)


def _other_env_vars() -> str:
    lines = [
        "## Other environment variables\n",
        "Read by kvserve but not config fields (so not in a config file or `--set`):\n",
        "| Variable | Description |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {_text(description)} |" for name, description in OTHER_ENV_VARS.items()]
    return "\n".join(lines) + "\n"


def _type(field: FieldInfo) -> str:
    return _annotation_type(field.annotation, list(field.metadata))


def _annotation_type(annotation: Any, metadata: list[Any]) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *more = get_args(annotation)
        return _annotation_type(base, [*more, *metadata])
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        text = " or ".join(_annotation_type(a, metadata) for a in args if a is not type(None))
        return f"{text} or none" if type(None) in args else text
    if origin is Literal:
        return ", ".join(f"`{value}`" for value in get_args(annotation))
    if origin is list:
        return "list"
    if _is_model(annotation) or origin is dict:
        return "mapping or JSON text"
    if annotation is ByteSize:
        return "size" + _bounds(metadata)
    if annotation is SecretStr:
        return "text (secret: never logged)"
    names = {bool: "boolean", int: "integer", float: "number", str: "text"}
    return names[annotation] + _bounds(metadata)


_BOUNDS = {annotated_types.Gt: ("gt", ">"), annotated_types.Ge: ("ge", "≥"), annotated_types.Lt: ("lt", "<"),
           annotated_types.Le: ("le", "≤")}  # fmt: skip


def _bounds(metadata: list[Any]) -> str:
    """`` ≥ 0``, `` > 0, ≤ 1``, or `` 0–2`` for a closed range."""
    limits = {type(m): getattr(m, _BOUNDS[type(m)][0]) for m in metadata if type(m) in _BOUNDS}
    if limits.keys() == {annotated_types.Ge, annotated_types.Le}:
        return f" {limits[annotated_types.Ge]}–{limits[annotated_types.Le]}"
    return ",".join(f" {_BOUNDS[kind][1]} {value}" for kind, value in limits.items())


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return "see below" if isinstance(value, BaseModel) else _value(value)


def _value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, ByteSize):
        unit, size = next(((u, size) for u, size in _UNITS if value % size == 0), ("", 1))
        return f"`{value // size}{unit}`"
    return f"`{value}`"


_UNITS = [("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)]


def _description(field: FieldInfo) -> str:
    return _text(field.description or "")


def _param_type(param: Any) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    annotation = param.type_descriptor.annotation
    names = {int: "integer", float: "number", str: "text", Path: "file", list[str]: "text"}
    text = names.get(annotation, getattr(annotation, "__name__", str(annotation)))
    if param.min is not None or param.max is not None:
        text += f" {param.min}–{param.max}" if param.max is not None else f" ≥ {param.min}"
    if param.multiple:
        text += ", repeatable"
    if param.nargs == -1:
        text += ", one or more" if param.required else ", any number"
    return text


def _param_default(param: Any) -> str:
    if param.param_type_name == "argument" and param.required:
        return "required"
    if getattr(param, "is_flag", False) and not param.default:
        return "off"
    return "–" if param.default is None else _value(param.default)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds, optional or not (``SpeculativeConfig | None``), or None."""
    if get_origin(annotation) in (Union, types.UnionType):
        models = [a for a in get_args(annotation) if _is_model(a)]
        return models[0] if len(models) == 1 else None
    return annotation if _is_model(annotation) else None


def _text(text: str) -> str:
    """Markdown for a table cell or paragraph: reST ````code```` as `code`, no raw ``|`` or ``<``, one line."""
    return " ".join(text.replace("``", "`").replace("|", "\\|").replace("<", "&lt;").split())


def main(argv: list[str] | None = None) -> None:
    """``python -m kvserve.cli.config_docs PATH``: write the page to PATH (default: print it)."""
    args = sys.argv[1:] if argv is None else argv
    page = render()
    if args:
        Path(args[0]).write_text(page)
    else:
        sys.stdout.write(page)


if __name__ == "__main__":
    main()
