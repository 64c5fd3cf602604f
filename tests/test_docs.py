"""The README and docs/ hold to the repository: links resolve, documented commands, flags and config fields
exist, the compatibility tables list exactly the request models' fields, and nothing points outside the repo.

Static reading only (plus importing the CLI, the config and the request models): no engine is built.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer.main

from kvserve.cli.app import app, load_commands
from kvserve.cli.config_docs import OTHER_ENV_VARS
from kvserve.config import FLAT_FIELDS
from kvserve.sampling_params import SamplingParams
from kvserve.server.protocol import ChatCompletionRequest, CompletionRequest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/peers/README.md"]
README_MAX_LINES = 150

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
OUTSIDE_REPO = {
    "a sibling folder (../shared)": re.compile(r"\.\./shared"),
    "a machine path (/work/)": re.compile(r"/work/"),
    "the issue tracker (issue N)": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose_and_code(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose lines, code-block lines), each with its line number; fenced blocks are code."""
    prose, code, fenced = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        (code if fenced else prose).append((number, line))
    return prose, code


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    return heading_anchors(path.read_text())


def heading_anchors(text: str) -> frozenset[str]:
    """Every heading anchor of a markdown page (repeats get ``-1``, ``-2``, as on GitHub)."""
    prose, _ = prose_and_code(text)
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose:
        if match := re.match(r"^#{1,6}\s+(.*)", line):
            anchor = github_anchor(match.group(1))
            count = seen.get(anchor, 0)
            found.add(anchor if count == 0 else f"{anchor}-{count}")
            seen[anchor] = count + 1
    return frozenset(found)


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """Relative links of ``page`` (its ``text``, else the file's) that miss a file or a heading anchor."""
    text = page.read_text() if text is None else text
    prose, _ = prose_and_code(text)
    problems = []
    for number, line in prose:
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(1) or match.group(2)
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:: not the repository's to check
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / path_part).resolve()
            where = f"{rel(page)}:{number}: {target}"
            if not path_part:
                if anchor not in heading_anchors(text):
                    problems.append(f"{where}: no heading with anchor #{anchor} on this page")
            elif not resolved.is_relative_to(ROOT):
                problems.append(f"{where} leaves the repository")
            elif not resolved.exists():
                problems.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: no heading with anchor #{anchor} in {rel(resolved)}")
    return problems


def code_texts(text: str) -> list[tuple[int, str]]:
    """Inline code spans and code-block lines (continuation backslashes joined), with line numbers."""
    prose, code = prose_and_code(text)
    texts = [(number, span) for number, line in prose for span in CODE_SPAN.findall(line)]
    pending, start = "", 0
    for number, line in code:
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        texts.append((start, pending + line))
        pending = ""
    return texts


@cache
def cli() -> Any:
    """The ``kvserve`` command as click objects (typer's own click: groups are told apart by ``commands``)."""
    load_commands()
    return typer.main.get_command(app)


def is_group(command: Any) -> bool:
    return hasattr(command, "commands")


def option_names(command: Any) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


KVSERVE_COMMAND = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?kvserve\s+([a-z].*)")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def kvserve_invocation_problems(page: Path, text: str | None = None) -> list[str]:
    """``kvserve <command> [<subcommand>] ... --flag`` in code: the command and every flag exist."""
    problems = []
    for number, code in code_texts(page.read_text() if text is None else text):
        stripped = code.strip()
        words = stripped.split()
        while words and ENV_ASSIGNMENT.match(words[0]):  # KVSERVE_API_KEY=secret kvserve serve
            words.pop(0)
        if not words or not re.fullmatch(r"(\S*/)?kvserve", words[0]):
            continue  # only a shell line or a span that starts with the command: not `from kvserve import`
        match = KVSERVE_COMMAND.search(" ".join(words))
        if match is None:
            continue
        try:
            tokens = shlex.split(match.group(1).split(" #", 1)[0])
        except ValueError:
            tokens = match.group(1).split()
        command = cli()
        path = ["kvserve"]
        while is_group(command) and tokens and tokens[0] in command.commands:
            path.append(tokens[0])
            command = command.commands[tokens.pop(0)]
        where = f"{rel(page)}:{number}: {stripped}"
        if is_group(command) and tokens and not tokens[0].startswith("-"):
            problems.append(f"{where}: {' '.join(path)} has no command {tokens[0]!r}")
            continue
        known = option_names(command)
        for token in tokens:
            if token in {"|", "&&", ";", "||", ">", "2>&1"}:
                break
            if token.startswith("-") and token != "-":
                flag = token.split("=", 1)[0]
                if flag not in known:
                    problems.append(f"{where}: `{' '.join(path)}` has no option {flag}")
    return problems


BENCHMARK_ENV_VARS = {"KVSERVE_PEERS_DIR": "benchmarks/peers/setup.sh", "KVSERVE_FIELD": ""}
"""Variables the docs name that are not kvserve's own: the peers' folder (read by the benchmarks and the
setup script), and the pattern ``KVSERVE_FIELD`` itself."""
SET_FIELD = re.compile(r"(?:--set|-o)\s+([a-z_]+)=")
ENV_FIELD = re.compile(r"\b(KVSERVE_[A-Z0-9_]+)\b")
NAMED_FIELD = re.compile(r"config(?: field)? `([a-z_]+)`")


def config_field_problems(page: Path) -> list[str]:
    """Config fields the page names (``--set FIELD=``, ``KVSERVE_FIELD``, "config field `x`", the limits
    table's config column) exist in ``EngineConfig``."""
    text = page.read_text()
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for name in SET_FIELD.findall(line) + NAMED_FIELD.findall(line):
            if name not in FLAT_FIELDS:
                problems.append(f"{rel(page)}:{number}: {name!r} is not a config field")
        for variable in ENV_FIELD.findall(line):
            field = variable.removeprefix("KVSERVE_").lower()
            if field not in FLAT_FIELDS and variable not in OTHER_ENV_VARS | BENCHMARK_ENV_VARS:
                problems.append(f"{rel(page)}:{number}: {variable} is neither a config field's variable nor read")
    for row in table_rows(text, "## Limits", "config field"):
        for name in re.findall(r"`([a-z_]+)`", row["config field"]):
            if name not in FLAT_FIELDS:
                problems.append(f"{rel(page)}: limits table: {name!r} is not a config field")
    return problems


def table_rows(text: str, section: str, needed_column: str) -> list[dict[str, str]]:
    """Rows, as {column: cell}, of every table under the ``section`` heading (until the next heading of its
    level) whose header has ``needed_column``."""
    level = section.split()[0]
    lines = text.splitlines()
    try:
        start = lines.index(section)
    except ValueError:
        return []
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in lines[start + 1 :]:
        if re.match(rf"^#{{1,{len(level)}}}\s", line):
            break
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            if needed_column in header:
                rows.append(dict(zip(header, cells, strict=False)))
    return rows


def first_name(cell: str) -> str | None:
    match = re.fullmatch(r"`([a-z_]+)`", cell)
    return match.group(1) if match else None


COMPATIBILITY = ROOT / "docs/compatibility.md"


# -- the tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_anchors_follow_github() -> None:
    assert github_anchor("One request's path") == "one-requests-path"
    assert github_anchor("`kvserve bench serve`") == "kvserve-bench-serve"
    assert github_anchor("1. The package") == "1-the-package"
    assert github_anchor("Compatibility with OpenAI and vLLM") == "compatibility-with-openai-and-vllm"


def test_a_broken_link_is_found() -> None:
    """The checker itself: a missing file and a missing anchor are both reported."""
    page = ROOT / "docs" / "probe.md"  # never written: its text is given
    problems = broken_links(page, "# Probe\n\n[ok](#probe) [gone](nowhere.md) [bad](serving.md#no-such) [x](#x)\n")
    assert len(problems) == 3, problems
    assert "no such file" in problems[0] and "#no-such" in problems[1] and "#x" in problems[2]


def test_documented_make_targets_exist() -> None:
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    problems = []
    for page in PAGES:
        for number, text in code_texts(page.read_text()):
            for target in re.findall(r"(?:^|[\s;&`])make\s+([a-z][\w-]*)", text):
                if target not in targets:
                    problems.append(f"{rel(page)}:{number}: make {target}: no such target in the Makefile")
    assert problems == []


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_documented_kvserve_invocations_exist(page: Path) -> None:
    assert kvserve_invocation_problems(page) == []


def test_a_wrong_flag_is_found() -> None:
    text = "```bash\nkvserve serve --port 1 --no-such-flag\nkvserve sevre\n.venv/bin/kvserve bench serve -O 1\n```\n"
    problems = kvserve_invocation_problems(ROOT / "docs" / "probe.md", text)
    assert len(problems) == 3, problems
    assert "--no-such-flag" in problems[0] and "'sevre'" in problems[1] and "-O" in problems[2]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_documented_config_fields_exist(page: Path) -> None:
    assert config_field_problems(page) == []


def test_benchmark_variables_are_read() -> None:
    for variable, reader in BENCHMARK_ENV_VARS.items():
        if reader:
            assert variable in (ROOT / reader).read_text(), f"{reader} no longer reads {variable}"


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; keep it to {README_MAX_LINES}, move detail to docs/"
    )


def test_readme_starts_with_the_two_commands() -> None:
    """A newcomer's first two commands do every set-up: the first fenced shell block is make demo, make test."""
    first_shell_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_shell_block.strip().splitlines()]
    assert commands == ["make demo", "make test"]


@pytest.mark.parametrize(
    "path",
    [*PAGES, *sorted((ROOT / "benchmarks").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.sh"))],
    ids=rel,
)
def test_nothing_refers_outside_the_repository(path: Path) -> None:
    problems = [
        f"{rel(path)}:{number}: refers to {what}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for what, pattern in OUTSIDE_REPO.items()
        if pattern.search(line)
    ]
    assert problems == []


# -- compatibility.md against the request models ---------------------------------------------------


def documented_request_fields() -> dict[str, set[str]]:
    rows = table_rows(COMPATIBILITY.read_text(), "## Request fields", "endpoints")
    fields: dict[str, set[str]] = {"completions": set(), "chat": set()}
    for row in rows:
        name = first_name(row["field"])
        assert name is not None, f"compatibility.md: a request-field row names no field: {row}"
        assert row["endpoints"] in {"both", "completions", "chat"}, row
        assert row["status"] in {"honoured", "ignored", "limited", "refused"}, row
        for endpoint in ("completions", "chat") if row["endpoints"] == "both" else (row["endpoints"],):
            fields[endpoint].add(name)
    return fields


@pytest.mark.parametrize(("endpoint", "model"), [("completions", CompletionRequest), ("chat", ChatCompletionRequest)])
def test_request_fields_table_matches_the_request_model(endpoint: str, model: type) -> None:
    documented = documented_request_fields()[endpoint]
    actual = set(model.model_fields)
    assert actual - documented == set(), f"{model.__name__} fields missing from docs/compatibility.md"
    assert documented - actual == set(), f"docs/compatibility.md lists fields {model.__name__} does not have"


def test_fields_said_to_be_refused_by_name_are_not_accepted() -> None:
    text = COMPATIBILITY.read_text()
    section = text.split("## vLLM request fields kvserve does not take", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`([a-z_]+)`", section)) - {"echo", "logprobs"}  # named as what to use instead
    accepted = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert names and names & accepted == set()


def test_sampling_params_table_matches_the_model() -> None:
    rows = table_rows(COMPATIBILITY.read_text(), "## Offline: `SamplingParams`", "field")
    documented = {first_name(row["field"]) for row in rows}
    assert documented == set(SamplingParams.model_fields)


def test_vllm_flag_table_names_real_kvserve_options() -> None:
    serve_options = option_names(cli().commands["serve"])
    problems = []
    for row in table_rows(COMPATIBILITY.read_text(), "## `vllm serve` flags", "kvserve"):
        for span in re.findall(r"`([^`]+)`", row["kvserve"]):
            words = span.split()
            if words[:2] == ["kvserve", "serve"] or not words[0].startswith("-"):
                continue
            if words[0] == "--set":
                field = words[1].split("=", 1)[0]
                if field not in FLAT_FIELDS:
                    problems.append(f"{span}: {field!r} is not a config field")
            elif words[0] not in serve_options:
                problems.append(f"{span}: kvserve serve has no option {words[0]}")
    assert problems == []
