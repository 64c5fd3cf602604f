"""docs/configuration.md is what :mod:`kvserve.cli.config_docs` renders from the code, and what it
infers from the code is true: each flag it lists sets its field, each ``KVSERVE_*`` variable the code
reads is on the page, and the page's examples load."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvserve.cli import config_docs, options
from kvserve.cli.app import app
from kvserve.config import FLAT_FIELDS, EngineConfig
from kvserve.config_sources import env_var, load_config

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "configuration.md"

CONFIG_COMMANDS = [c for c in config_docs.cli_commands() if c.reads_config]
REQUIRED_ARGS = {"generate": ["hi"], "chat": ["--local"]}
"""What a command needs besides the option under test to get as far as reading its config."""


def test_the_page_is_current() -> None:
    page, rendered = PAGE.read_text(), config_docs.render()
    diff = "".join(
        list(difflib.unified_diff(page.splitlines(True), rendered.splitlines(True), "docs/configuration.md", "code"))[
            :60
        ]
    )
    assert page == rendered, f"docs/configuration.md differs from the config model and the CLI: run `make docs`\n{diff}"


class _ReadConfig(Exception):
    pass


def _value(param: Any) -> tuple[list[str], Any]:
    """Command-line words giving ``param`` a value, and the value the command should pass on."""
    if getattr(param, "is_flag", False):
        return [param.opts[0]], True
    if getattr(param, "multiple", False):  # a repeatable option passes the list of its values
        return [param.opts[0], "x"], ["x"]
    annotation = param.type_descriptor.annotation
    value = {int: param.min if param.min is not None else 1, float: 1.5}.get(annotation, "x")
    words = [str(value)] if param.param_type_name == "argument" else [param.opts[0], str(value)]
    return words, value


@pytest.mark.parametrize(
    ("command", "param"),
    [(c, p) for c in CONFIG_COMMANDS for p in c.field_params()],
    ids=lambda x: getattr(x, "path", None) or x.name,
)
def test_each_listed_flag_sets_its_field(command: Any, param: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    passed: dict[str, Any] = {}

    def config_fields(config_file: Any, overrides: dict[str, Any]) -> dict[str, Any]:
        passed.update(overrides)
        raise _ReadConfig

    monkeypatch.setattr(options, "config_fields", config_fields)
    words, value = _value(param)
    result = CliRunner().invoke(app, [*command.path.split(), *REQUIRED_ARGS.get(command.path, []), *words])
    assert isinstance(result.exception, _ReadConfig), result.output
    assert passed == {param.name: value}, f"kvserve {command.path} {' '.join(words)}"


@pytest.mark.parametrize("command", CONFIG_COMMANDS, ids=lambda c: c.path)
def test_a_default_a_flag_states_is_the_fields(command: Any) -> None:
    sections = {name: info.annotation for name, info in EngineConfig.model_fields.items()}
    fields = {name: sections[section].model_fields[name] for name, section in FLAT_FIELDS.items()}  # type: ignore[union-attr]
    for param in command.field_params():
        stated = re.search(r"\(default: ([^,)]+)", param.help or "")
        default = fields[param.name].default
        if stated and default is not None and not isinstance(default, bool):
            assert stated[1] == str(default), f"kvserve {command.path} {param.opts}: help says {stated[1]}"


def test_every_kvserve_variable_the_code_reads_is_on_the_page() -> None:
    sources = [
        *ROOT.glob("core/src/**/*.py"),
        *ROOT.glob("platforms/*/src/**/*.py"),
        *ROOT.glob("plugins/**/src/**/*.py"),
    ]
    named = {
        name
        for path in sources
        if path.name != "config_docs.py"
        for name in re.findall(r"\bKVSERVE_[A-Z][A-Z0-9_]*", path.read_text())
    }
    config_vars = {env_var(name) for name in FLAT_FIELDS}
    assert named - config_vars == set(config_docs.OTHER_ENV_VARS), "update OTHER_ENV_VARS in kvserve/cli/config_docs.py"
    assert not config_vars & set(config_docs.OTHER_ENV_VARS), "a config field's variable is also another setting's"


def test_the_pages_examples_load(tmp_path: Path) -> None:
    blocks = dict(re.findall(r"```(yaml|toml)\n(.*?)```", config_docs.render(), re.DOTALL))
    for suffix, text in blocks.items():
        (tmp_path / f"kvserve.{suffix}").write_text(text)
        config = load_config(tmp_path / f"kvserve.{suffix}", environ={})
        assert (config.model.max_model_len, config.server.port) == (2048, 8001)
    assert load_config(tmp_path / "kvserve.yaml", environ={}).scheduler.max_num_seqs == 64
    assert EngineConfig(scheduler={"max_num_seqs": 8}) == EngineConfig.from_flat(max_num_seqs=8)
