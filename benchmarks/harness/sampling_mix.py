"""The sampling modes the peer benchmarks run (``--sampling greedy,t1,t07p09``) and the machine's ISA
that every figure is reported with.

Real clients sample (OpenAI's and vLLM's default is ``temperature=1.0``; chat front ends send about
``temperature=0.7, top_p=0.9``), so a figure taken only greedy says little of what users get.
Each mode is a set of request fields every engine is given alike, explicitly (no engine's or model's
own defaults fill them: top-k, min-p and penalties are off).
"""

from __future__ import annotations

from typing import Any

from kvserve_cpu_native import cpu_name_and_flags

SAMPLING_MODES: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0, "top_p": 1.0},
    "t1": {"temperature": 1.0, "top_p": 1.0},
    "t07p09": {"temperature": 0.7, "top_p": 0.9},
}
"""Mode name -> the request's sampling fields (as vLLM's and kvserve's SamplingParams and the OpenAI API name them)."""
DEFAULT_SAMPLING_MIX = ",".join(SAMPLING_MODES)


def parse_sampling_mix(text: str) -> dict[str, dict[str, Any]]:
    """``"greedy,t07p09"`` -> those modes of :data:`SAMPLING_MODES`, in that order; ValueError naming the
    unknown ones."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SAMPLING_MODES]
    if unknown or not names:
        raise ValueError(f"--sampling {text!r}: unknown modes {unknown}; choose from {', '.join(SAMPLING_MODES)}")
    return {name: SAMPLING_MODES[name] for name in dict.fromkeys(names)}


def describe_mode(name: str) -> str:
    """``t07p09`` -> ``t07p09 (temperature=0.7, top_p=0.9)``."""
    fields = SAMPLING_MODES[name]
    if fields["temperature"] == 0.0:
        return f"{name} (temperature=0)"
    shown = ", ".join(f"{key}={value:g}" for key, value in fields.items() if not (key == "top_p" and value == 1.0))
    return f"{name} ({shown})"


def machine_isa() -> str:
    """The CPU and the widest matmul ISA it has, as the figures depend on it: ``AMX``, ``AVX-512`` (with
    ``+BF16`` where it has native bfloat16 dot products), ``AVX2``, else the architecture's flags in short."""
    name, flags = cpu_name_and_flags()
    if "amx_bf16" in flags or "amx_tile" in flags:
        isa = "AMX + AVX-512"
    elif "avx512f" in flags:
        isa = "AVX-512" + (" + BF16" if "avx512_bf16" in flags else "") + ", no AMX"
    elif "avx2" in flags:
        isa = "AVX2, no AVX-512"
    else:
        isa = " ".join(sorted(flag for flag in flags if flag in ("asimd", "sve", "sve2", "bf16", "i8mm"))) or "?"
    return f"{name} ({isa})"
