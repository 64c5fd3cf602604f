"""kvserve_cpu_native: a plugin's C++ operators built with the real compiler, cached, and refused clearly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kvserve_cpu_native import (
    NativeBuildError,
    build_directory,
    build_failure_reason,
    cache_directory,
    load_operators,
    unavailable_reason,
)

pytestmark = pytest.mark.skipif(build_failure_reason() is not None, reason=f"no native build: {build_failure_reason()}")

SCALE_SOURCE = """
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

// x *= factor, in place, on torch's intra-op threads.
void scale_(at::Tensor& x, double factor) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == at::kFloat, "scale_: contiguous float32 only");
  float* data = x.data_ptr<float>();
  at::parallel_for(0, x.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) data[i] *= static_cast<float>(factor);
  });
}

TORCH_LIBRARY(kvserve_native_test, m) { m.def("scale_(Tensor(a!) x, float factor) -> ()", &scale_); }
"""


def test_operators_build_load_and_run(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSERVE_NATIVE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "scale.cpp"
    source.write_text(SCALE_SOURCE)
    load_operators("kvserve_native_test", (source,))
    x = torch.arange(10_000, dtype=torch.float32)
    torch.ops.kvserve_native_test.scale_(x, 0.5)
    assert torch.equal(x, torch.arange(10_000, dtype=torch.float32) * 0.5)
    with pytest.raises(RuntimeError, match="contiguous float32 only"):  # the operator's own check reaches Python
        torch.ops.kvserve_native_test.scale_(torch.ones(3, dtype=torch.float64), 2.0)
    built = list(cache_directory().glob("kvserve_native_test/*/*.so"))
    assert built and str(cache_directory()).startswith(str(tmp_path / "cache")), built


def test_a_source_that_does_not_compile_names_the_library_and_the_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSERVE_NATIVE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "broken.cpp"
    source.write_text("int main() { return undefined_symbol_here; }\n")
    with pytest.raises(NativeBuildError, match="cannot build kvserve_native_broken"):
        load_operators("kvserve_native_broken", (source,))


def test_no_compiler_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert "no C++ compiler" in build_failure_reason()
    with pytest.raises(NativeBuildError, match="no-such-compiler-here"):
        load_operators("kvserve_native_never_built", ())


def test_unavailable_reason_names_the_library_and_does_not_retry_a_failed_build(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSERVE_NATIVE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "broken_once.cpp"
    source.write_text("int main() { return undefined_symbol_here; }\n")
    first = unavailable_reason("kvserve_native_broken_once", (source,))
    assert first.startswith("cannot build kvserve_native_broken_once in ")
    source.write_text(SCALE_SOURCE)  # a fixed source is not picked up in this process: no second build
    assert unavailable_reason("kvserve_native_broken_once", (source,)) == first
    monkeypatch.setenv("CXX", "no-such-compiler-here")  # the tools, though, are checked every time
    assert unavailable_reason("kvserve_native_broken_once", (source,)).startswith(
        "cannot build kvserve_native_broken_once: no C++ compiler ('no-such-compiler-here'"
    )


def test_a_build_killed_midway_does_not_block_the_next_start(tmp_path):
    """torch's ``lock`` file, left behind by a builder that was killed, used to make every later
    start wait forever; the next build now goes ahead and loads."""
    env = {"KVSERVE_NATIVE_CACHE": str(tmp_path / "cache")}
    source = tmp_path / "scale.cpp"
    source.write_text(SCALE_SOURCE)
    script = (
        "import sys, torch; from pathlib import Path; from kvserve_cpu_native import build_directory, load_operators\n"
        "build = build_directory('kvserve_native_test', (Path(sys.argv[1]),)); build.mkdir(parents=True)\n"
        "(build / 'lock').touch()  # as a killed builder leaves it\n"
        "load_operators('kvserve_native_test', (Path(sys.argv[1]),))\n"
        "x = torch.ones(3); torch.ops.kvserve_native_test.scale_(x, 2.0); print(x.tolist())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(source)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("[2.0, 2.0, 2.0]")


def test_each_version_of_the_sources_keeps_its_own_build(tmp_path, monkeypatch):
    """Two checkouts of a plugin must not rebuild over each other at every start: torch's builder
    writes the sources' paths into its ninja file, so the same kernel at two paths would rebuild at
    each switch. The build folder follows the sources' and their headers' place and content."""
    monkeypatch.setenv("KVSERVE_NATIVE_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "scale.cpp", tmp_path / "b" / "scale.cpp"
    for source in (first, second):
        source.parent.mkdir()
        source.write_text(SCALE_SOURCE)
    assert build_directory("ops", (first,)) == build_directory("ops", (first,))
    assert build_directory("ops", (first,)) != build_directory("ops", (second,))
    before = build_directory("ops", (second,))
    (second.parent / "helpers.h").write_text("#pragma once\n")
    assert build_directory("ops", (second,)) != before
    (second.parent / "helpers.h").unlink()
    assert build_directory("ops", (second,)) == before
    second.write_text(SCALE_SOURCE + "\n// changed\n")
    assert build_directory("ops", (second,)) != before
    assert build_directory("ops", (first,)).parent == cache_directory() / "ops"
