"""C++ operators a plugin ships as source, built on first use and cached on disk.

The CPU build machinery the CPU platform and the CPU attention backend share (a package of its own
so that kvserve-core names no device or instruction set).

A plugin keeps its kernels as ``.cpp`` files that register ``torch.library`` operators
(``TORCH_LIBRARY(namespace, m)``); :func:`load_operators` compiles them with torch's own JIT
extension build (``torch.utils.cpp_extension.load``: the installed torch's headers and ABI, ninja,
the system C++ compiler) into ``~/.cache/kvserve/torch_extensions/<python>-<torch>-<cpu>/<name>/<hash>``
(a hash of the sources' place and content and of the Python environment), so only the first start
with those sources pays the compile (a few seconds). Building on the machine that runs it allows
``-march=native``: the kernels get the vector instructions this CPU has without a wheel per
instruction set.

Where no compiler or ninja is available the build fails with :class:`NativeBuildError`; a
plugin then keeps its portable path and says why: :func:`unavailable_reason` gives that sentence
(or None once the operators are loaded). :func:`cpu_name_and_flags` says what the CPU is and
which feature flags it has, for plugins that choose (and tests that check) what their kernels run on.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path

from platformdirs import user_cache_dir


class NativeBuildError(RuntimeError):
    """A plugin's C++ operators could not be built or loaded; the message says why."""


def cache_directory() -> Path:
    """Where built operator libraries live: ``$KVSERVE_NATIVE_CACHE`` or the user cache, one folder
    per Python, torch version and CPU instruction set (a library is only valid for the ABI it was
    built against, and ``-march=native`` code only on CPUs with the same instructions)."""
    import torch

    root = os.environ.get("KVSERVE_NATIVE_CACHE") or Path(user_cache_dir("kvserve")) / "torch_extensions"
    version = torch.__version__.replace("+", "_")
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}-torch{version}-{_cpu_fingerprint()}"


def _cpu_fingerprint() -> str:
    """A short hash of the CPU's architecture and feature flags (Linux's ``/proc/cpuinfo``)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return hashlib.sha256(f"{platform.machine()} {flags}".encode()).hexdigest()[:12]


@functools.cache
def cpu_name_and_flags() -> tuple[str, frozenset[str]]:
    """The CPU model name and its feature flags (``/proc/cpuinfo`` on Linux; torch's probes elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), _flags_from_torch()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    # ARM kernels say "Features", x86 "flags".
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())
    return fields.get("model name") or platform.processor() or platform.machine(), flags


def _flags_from_torch() -> frozenset[str]:
    """The bf16 flags torch's own CPU probes report (macOS, Windows: no /proc/cpuinfo)."""
    import torch

    probes = {"amx_bf16": torch.cpu._is_amx_tile_supported, "avx512_bf16": torch.cpu._is_avx512_bf16_supported}
    return frozenset(flag for flag, probe in probes.items() if probe())


def build_failure_reason() -> str | None:
    """Why nothing can be built here (no C++ compiler, no ninja), judged without compiling; None if
    a build can be tried."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} is not on PATH; set CXX)"
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    return None


def build_directory(name: str, sources: tuple[Path, ...]) -> Path:
    """The build folder of library ``name`` from ``sources``: one per content and place of the sources
    and the headers beside them and per Python environment, so two installed versions of a plugin (two
    checkouts, two venvs) each keep their build instead of rebuilding over each other at every start
    (torch's builder writes the sources' paths and the environment's include folders into its ninja
    file, so the same sources at another path, or under another venv, would rebuild)."""
    digest = hashlib.sha256(sys.prefix.encode())
    files = {*sources, *(header for source in sources for header in Path(source).parent.glob("*.h"))}
    for path in sorted(files, key=str):
        digest.update(str(Path(path).resolve()).encode() + b"\0" + Path(path).read_bytes())
    return cache_directory() / name / digest.hexdigest()[:16]


@functools.cache
def load_operators(name: str, sources: tuple[Path, ...], openmp: bool = True) -> None:
    """Build (or reuse the cached build of) ``sources`` as the library ``name`` and load it into
    this process, registering its ``torch.library`` operators under ``torch.ops``.

    Compiled ``-O3 -march=native`` (and ``-fopenmp`` when ``openmp``; torch's ``at::parallel_for``
    then runs on torch's intra-op thread pool). Loading twice in one process is a no-op.

    Raises:
        NativeBuildError: no compiler or ninja, or the compiler/loader failed (the message carries
            the library name and the tool's last output lines).
    """
    reason = build_failure_reason()
    if reason is not None:
        raise NativeBuildError(f"cannot build {name}: {reason}")
    import fcntl

    from torch.utils.cpp_extension import load

    build_dir = build_directory(name, sources)
    build_dir.mkdir(parents=True, exist_ok=True)
    flags = ["-O3", "-march=native", "-std=c++17", "-Wno-unused-parameter"] + (["-fopenmp"] if openmp else [])
    # torch's own guard is a ``lock`` file its builder deletes when done; a builder that was killed
    # leaves it, and every later start waits on it forever. This flock the kernel drops with its
    # holder: whoever holds it is the only builder, so a ``lock`` file found then is a dead one's.
    with open(build_dir / "kvserve-build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        try:
            load(
                name,
                [str(s) for s in sources],
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"] if openmp else [],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
            )
        except (RuntimeError, OSError, ImportError) as error:  # what torch's build raises for a failed compile or load
            tail = "\n".join(str(error).strip().splitlines()[-8:])
            raise NativeBuildError(f"cannot build {name} in {build_dir}: {tail}") from error


def unavailable_reason(name: str, sources: tuple[Path, ...]) -> str | None:
    """None once the library ``name`` is loaded in this process (:func:`load_operators`, building it
    if needed); else why it cannot be, as :class:`NativeBuildError` says it (``"cannot build
    <name>: ..."``), for a plugin's fallback and its start-up line.

    The build tools are checked on every call (``CXX`` may change between engines), a build at
    most once per process: a failed compile is not retried by every engine that asks."""
    reason = build_failure_reason()
    if reason is not None:
        return f"cannot build {name}: {reason}"
    return _load_once(name, sources)


@functools.cache
def _load_once(name: str, sources: tuple[Path, ...]) -> str | None:
    try:
        load_operators(name, sources)
    except NativeBuildError as error:
        return str(error)
    return None
