"""The example plugins under examples/ install as packages, pass their own contract tests, and
``kvserve plugins check`` passes over them and fails over a broken package.

Everything runs in subprocesses that see a temporary install directory: this process (and the
environment) never registers the example plugins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvserve.testing.check import run_pytest

REPO = Path(__file__).resolve().parents[1]
# Narrower than the full suites, which the examples' own tests run: enough to exercise the command.
CHECK_ARGS = ["-k", "not bfloat16 and not float16 and not d128", "--seeds", "1"]


def install(sources: list[Path], target: Path, scratch: Path) -> Path:
    """``pip install --target`` copies of ``sources`` (building in a copy keeps the checkout clean)."""
    copies = []
    for source in sources:
        copy = scratch / source.name
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        copies.append(str(copy))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target)]
    subprocess.run([*pip, *copies], check=True)
    return target


def environment(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "250"}


def kvserve(site: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "kvserve.cli", *args]
    return subprocess.run(command, cwd=REPO, env=environment(site), capture_output=True, text=True)


@pytest.fixture(scope="module")
def site(examples, tmp_path_factory) -> Path:
    """A directory with every example package installed."""
    scratch = tmp_path_factory.mktemp("example-sources")
    return install([e.path for e in examples], tmp_path_factory.mktemp("example-site"), scratch)


@pytest.fixture(scope="module")
def example_outcomes(examples, site):
    """Outcomes of one pytest run over every example's tests/, as a third party would run them."""
    run = run_pytest([str(e.path / "tests") for e in examples] + ["-q"], cwd=REPO, env=environment(site), capture=True)
    assert run.outcomes, run.output
    return run


def test_example_passes_its_own_contract_tests(example, example_outcomes):
    module = f"examples.{example.path.name}.tests."
    tests = {
        f"{classname.rpartition('.')[2]}::{name}": message
        for classname, results in example_outcomes.outcomes.items()
        if classname.startswith(module)
        for name, message in results.items()
    }
    assert tests, f"no test of {example.path.name} ran:\n{example_outcomes.output[-3000:]}"
    failed = {test: message.splitlines()[0] for test, message in tests.items() if message}
    assert not failed, failed


def test_plugins_check_lists_each_example_with_its_contract(examples, site):
    out = kvserve(site, "plugins", "check", "--list", *(e.distribution for e in examples))
    assert out.returncode == 0, out.stderr
    for name, contract in [
        ("example_cpu", "PlatformContract"),
        ("naive", "AttentionBackendContract"),
        ("free_list", "KVCacheManagerContract"),
        ("shortest_first", "SchedulerContract"),
        ("GPT2LMHeadModel", "ModelContract"),
        ("example_int8", "kvserve_example_quant.contract:Int8Contract"),
    ]:
        assert any(name in line and contract in line for line in out.stdout.splitlines()), (name, out.stdout)


def test_plugins_check_passes_over_the_installed_examples(examples, site):
    out = kvserve(site, "plugins", "check", *(e.distribution for e in examples), *CHECK_ARGS)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    assert "FAILED" not in out.stdout
    for example in examples:
        assert example.distribution in out.stdout


def test_plugins_check_fails_over_a_broken_package_naming_the_contract(tmp_path):
    """A third-party package whose backend writes K/V one slot off (core/tests/mutants) is rejected."""
    package = tmp_path / "src" / "broken_attention"
    (package / "broken_attention").mkdir(parents=True)
    (package / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "broken-attention"
        version = "0.0.1"
        [project.entry-points.kvserve]
        broken_attention = "broken_attention.plugin"
        """)
    )
    (package / "broken_attention" / "__init__.py").write_text("")
    shutil.copy(REPO / "core/tests/mutants/attention.py", package / "broken_attention" / "backend.py")
    (package / "broken_attention" / "plugin.py").write_text(
        textwrap.dedent("""
        from kvserve import hookimpl

        @hookimpl
        def register_attention_backends(register):
            register("cpu_wrong_slot", "broken_attention.backend:WrongSlotWrite")
        """)
    )
    site = install([package], tmp_path / "site", tmp_path / "scratch")
    out = kvserve(site, "plugins", "check", "broken-attention", *CHECK_ARGS)
    assert out.returncode == 1, out.stdout[-4000:] + out.stderr
    assert (
        "FAILED AttentionBackendContract for attention_backend 'cpu_wrong_slot' (broken-attention 0.0.1)" in out.stdout
    )
    assert "test_write_kv_stores_exactly_the_slot_mapping[float32]: Failed: write_kv put token 0's key" in out.stdout


def test_plugins_check_refuses_unknown_names(site):
    out = kvserve(site, "plugins", "check", "no-such-plugin")
    assert out.returncode == 2 and "no installed plugin matches 'no-such-plugin'" in out.stderr
