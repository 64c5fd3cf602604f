"""The tool parser that docs/tool_calling.md shows how to write passes the contract the page shows, and
loads as ``--tool-parser-plugin`` loads it."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

from kvserve.plugins import load_component
from kvserve.testing.check import run_pytest
from kvserve.tool_calling.plugin_file import load_tool_parser_file

PAGE = Path(__file__).parents[2] / "docs" / "tool_calling.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)


def test_the_documented_parser_passes_the_documented_contract(tmp_path: Path) -> None:
    parser = next(block for block in python_blocks() if "class FunctionTagParser" in block)
    contract = next(block for block in python_blocks() if "class FunctionTagContract" in block)
    (tmp_path / "function_tag.py").write_text(parser)
    (tmp_path / "function_tag_contract.py").write_text(contract)
    (tmp_path / "test_docs_parser.py").write_text(
        textwrap.dedent("""
        from function_tag import FunctionTagParser
        from function_tag_contract import FunctionTagContract


        class TestDocsParser(FunctionTagContract):
            @classmethod
            def load_component(cls):
                return FunctionTagParser
        """)
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    python_path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    run = run_pytest(
        ["test_docs_parser.py", "-q"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": python_path}, capture=True
    )
    outcomes = run.of_class("TestDocsParser")
    assert len(outcomes) > 20 and not any(outcomes.values()), run.output

    assert load_tool_parser_file(str(tmp_path / "function_tag.py")) == ["function_tag"]
    reply = load_component("tool_parser", "function_tag")(None, []).extract_tool_calls(
        'Hi <function=f>{"a": 1}</function>'
    )
    assert (reply.content, [(c.name, c.arguments) for c in reply.tool_calls]) == ("Hi ", [("f", '{"a": 1}')])
