"""Mutation checks of a contract suite: broken copies of a plugin must fail it, naming the bug.

A plugin author (or core) writes mutants — copies of a component with one plausible bug — and
asks, with :func:`contract_outcomes`, how each fares against its kind's contract next to the real
component, all in one pytest subprocess (an in-process session would unload the torch modules it
imported, and torch crashes when they are imported again)::

    outcomes = contract_outcomes(
        {
            "TestSkipsTheMask": Subject("structured_output_backend", "mutant_so:SkipsTheMask"),
            "TestReal": Subject("structured_output_backend", "my_package.backend:MyBackend"),
        },
        tmp_path,
        modules={"mutant_so": Path("mutants/structured_output.py")},
    )
    assert not failed(outcomes["TestReal"]) and failed(outcomes["TestSkipsTheMask"])

Importing this module does not import torch or pytest.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvserve.testing.check import import_target, run_pytest
from kvserve.testing.contracts import CONTRACTS

Outcomes = dict[str, str | None]
"""Test name -> failure message, None when it passed or was skipped."""


@dataclass(frozen=True)
class Subject:
    """A component class to run a contract against."""

    kind: str
    """The plugin kind, whose contract (and name attribute) applies."""
    target: str
    """``"module:Class"``, the class under test."""
    contract: str | None = None
    """``"module:Class"``, a subclass of the kind's contract to run instead (a parser family's cases)."""


def contract_class(test_class: str, subject: Subject) -> type:
    """A pytest test class running ``subject``'s contract with ``load_component`` returning its class."""
    info = CONTRACTS[subject.kind]
    component = import_target(subject.target)
    base = import_target(subject.contract or info.target)
    body = {
        info.name_attribute: component.name,
        "load_component": classmethod(lambda cls: component),
        "__qualname__": test_class,
    }
    return type(test_class, (base,), body)


def contract_outcomes(
    subjects: Mapping[str, Subject],
    root: Path,
    modules: Mapping[str, Path] | None = None,
    pytest_args: Sequence[str] = (),
) -> dict[str, Outcomes]:
    """Run each subject's contract in one pytest subprocess under ``root``; the outcomes by test class.

    ``modules``: module name -> source file, copied into ``root`` so that subjects can import them
    (the mutants); ``root`` goes first on ``PYTHONPATH``, which is otherwise kept (a checkout run from
    sources still finds itself). Raises AssertionError with pytest's output if a class ran nothing.
    """
    for name, source in (modules or {}).items():
        shutil.copyfile(source, root / f"{name}.py")
    lines = ["from kvserve.testing.mutation import Subject, contract_class", ""]
    for test_class, subject in subjects.items():
        lines.append(f"{test_class} = contract_class({test_class!r}, {subject!r})")
    (root / "test_mutants.py").write_text("\n".join(lines) + "\n")
    (root / "pytest.ini").write_text("[pytest]\n")
    python_path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path}
    run = run_pytest(["test_mutants.py", "-q", *pytest_args], cwd=root, env=env, capture=True)
    outcomes = {test_class: run.of_class(test_class) for test_class in subjects}
    assert all(outcomes.values()), f"a test class ran no test:\n{run.output}"
    return outcomes


def failed(outcomes: Outcomes, prefix: str = "") -> dict[str, str]:
    """The failures among ``outcomes`` (of one test class), of tests whose name starts with ``prefix``."""
    return {test: message for test, message in outcomes.items() if message and test.startswith(prefix)}
