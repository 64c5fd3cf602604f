"""kvserve's import graph has no cycle where the layering forbids one.

Every module of the package is parsed (not imported) and its imports collected: those inside
functions too (a lazy import is still a dependency), ``if TYPE_CHECKING:`` blocks left out (they
never run). ``from kvserve.x import name`` depends on ``kvserve.x.name`` when that is a module,
else on ``kvserve.x`` (its ``__init__``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

import kvserve

ROOT = Path(kvserve.__file__).parent


def module_names() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its ``__init__``)."""
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = ("kvserve", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth, outside ``if TYPE_CHECKING:`` bodies."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
            continue
        yield from _imports(node)


def import_graph() -> dict[str, set[str]]:
    """Module -> the kvserve modules it imports (relative imports resolved)."""
    modules = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                targets.add(child if child in modules else base)
        deps = set()
        for target in targets:
            # The longest kvserve module the name lies in (``import kvserve.a.b`` -> kvserve.a.b).
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                deps.add(target)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module: a shortest import path
    from the component's first module (by name) back to it (Tarjan's components, then a search)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        # Iterative Tarjan: (node, iterator over its neighbours).
        work = [(node, iter(sorted(graph.get(node, ()))))]
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        while work:
            current, neighbours = work[-1]
            for nxt in neighbours:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[current] = min(low[current], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[current])
                if low[current] == index[current]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == current:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(graph, set(c), c[0]) for c in components]


def _cycle_through(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """A shortest import path ``start -> ... -> start`` within ``members`` (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def package_graph(graph: dict[str, set[str]], packages: Iterable[str]) -> dict[str, set[str]]:
    """The module graph collapsed onto ``packages`` (dotted names); other modules are left out."""
    packages = tuple(packages)

    def owner(module: str) -> str | None:
        # The innermost of ``packages`` holding ``module``.
        return max((p for p in packages if module == p or module.startswith(p + ".")), key=len, default=None)

    collapsed: dict[str, set[str]] = {p: set() for p in packages}
    for module, deps in graph.items():
        source = owner(module)
        if source is None:
            continue
        collapsed[source].update(target for dep in deps if (target := owner(dep)) not in (None, source))
    return collapsed


def _describe(found: list[list[str]]) -> str:
    return "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_parser_sees_lazy_imports_and_skips_type_checking_ones():
    graph = import_graph()
    # executor/base.py names StepLogits for its annotations only; a worker builds its runner with
    # imports inside Worker.start, the engine opens the model with one inside __init__.
    assert "kvserve.runner.step_logits" not in graph["kvserve.executor.base"]
    assert "kvserve.runner.build" in graph["kvserve.executor.worker"]
    assert graph["kvserve.engine.llm_engine"] >= {"kvserve.loader", "kvserve.executor", "kvserve.config"}
    # ``from kvserve.runner import build`` names a module, ``from kvserve.loader import open_model`` a package's name.
    assert "kvserve.loader.open" not in graph["kvserve.engine.llm_engine"]


def test_cycle_finder_names_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", ["kvserve.frontend", "kvserve.engine", "kvserve.executor"])
def test_no_module_cycle_passes_through_the_frontend_engine_or_executor(package):
    found = [c for c in cycles(import_graph()) if any(m == package or m.startswith(package + ".") for m in c)]
    assert not found, f"import cycle through {package}: {_describe(found)}"


def test_engine_and_executor_packages_are_layered():
    """The executor runs steps for the engine: the engine package may import it, not the reverse."""
    found = cycles(package_graph(import_graph(), ["kvserve.engine", "kvserve.executor"]))
    assert not found, f"the engine and executor packages import each other: {_describe(found)}"


LAYERS = ["kvserve.frontend", "kvserve.engine", "kvserve.executor", "kvserve.runner"]
"""Top first: each package may import those below it, never one above."""


def test_frontend_engine_executor_and_runner_are_strictly_layered():
    """The frontend drives the engine, the engine the executor, the executor the runner: an import
    upwards (the engine reaching for ``AsyncLLM``, say) fails here even where it closes no cycle."""
    graph = package_graph(import_graph(), LAYERS)
    assert graph["kvserve.frontend"] >= {"kvserve.engine"}  # the parser sees the frontend at all
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if LAYERS.index(target) < LAYERS.index(source)
    )
    assert not upward, f"imports against the layering: {'; '.join(upward)}"


def test_no_cycle_among_the_subpackages():
    """Top-level modules and subpackages form layers: the frontend above the engine, the engine above
    the executors, the executors above the runner, every one of them above the interfaces."""
    graph = import_graph()
    units = {".".join(name.split(".")[:2]) for name in graph if name != "kvserve"}
    found = cycles(package_graph(graph, units))
    assert not found, f"kvserve's subpackages import each other: {_describe(found)}"
