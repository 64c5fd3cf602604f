"""The example plugin packages are tested the way a third party's would be: installed.

``test_examples.py`` installs them into a temporary directory (never into the environment,
where they would join every engine's ``auto`` choices) and runs their tests and
``kvserve plugins check`` in subprocesses that see that directory. An example's own
``tests/`` are collected here only where its package is importable (e.g. after
``pip install -e examples/attention``, or in those subprocesses).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent


@dataclass(frozen=True)
class ExamplePackage:
    path: Path
    distribution: str
    import_name: str


def example_packages() -> list[ExamplePackage]:
    """Every example package: a directory with a pyproject.toml and ``src/<import name>/``."""
    found = []
    for pyproject in sorted(EXAMPLES.glob("*/pyproject.toml")):
        (import_name,) = [p.name for p in (pyproject.parent / "src").iterdir() if p.name.isidentifier()]
        distribution = next(
            line.split('"')[1] for line in pyproject.read_text().splitlines() if line.startswith("name = ")
        )
        found.append(ExamplePackage(pyproject.parent, distribution, import_name))
    return found


collect_ignore = [
    str(package.path / "tests")
    for package in example_packages()
    if importlib.util.find_spec(package.import_name) is None
]


@pytest.fixture(scope="session")
def examples() -> list[ExamplePackage]:
    return example_packages()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "example" in metafunc.fixturenames:
        metafunc.parametrize("example", example_packages(), ids=lambda e: e.path.name)
