"""Hook specifications of kvserve plugins.

A plugin is a module named by an entry point in the ``kvserve`` group. It implements any
of the hooks below with ``@kvserve.hookimpl``. Every hook receives a ``register`` callable:

    register(name, "module:Object", api_version=1, **facts)

``name`` is how users select the component (for models: the HF ``architectures`` name),
``"module:Object"`` is imported only when the component is chosen, ``api_version`` is the
kvserve plugin API the registration was written for (omitted means 1), and ``facts`` are
cheap attributes used for selection without importing (``priority`` for platforms,
attention backends and schedulers: higher wins under ``auto``; ``unavailable``, a sentence
``kvserve plugins`` shows when a library the component needs is missing, e.g. a GPU extra).
"""

from collections.abc import Callable

import pluggy

hookspec = pluggy.HookspecMarker("kvserve")

Register = Callable[..., None]


@hookspec
def register_platforms(register: Register) -> None:
    """Register :class:`kvserve.interfaces.Platform` classes (facts: ``priority``)."""


@hookspec
def register_attention_backends(register: Register) -> None:
    """Register :class:`kvserve.interfaces.AttentionBackend` classes (facts: ``priority``)."""


@hookspec
def register_models(register: Register) -> None:
    """Register :class:`kvserve.interfaces.Model` classes under HF ``architectures`` names."""


@hookspec
def register_schedulers(register: Register) -> None:
    """Register :class:`kvserve.interfaces.Scheduler` classes (facts: ``priority``)."""


@hookspec
def register_kv_cache_managers(register: Register) -> None:
    """Register :class:`kvserve.interfaces.KVCacheManager` classes (facts: ``priority``)."""


@hookspec
def register_logits_processors(register: Register) -> None:
    """Register :class:`kvserve.interfaces.LogitsProcessor` classes (vLLM v1's batch-level interface),
    which the engine runs when its ``logits_processors`` config names them."""


@hookspec
def register_quantization_methods(register: Register) -> None:
    """Register :class:`kvserve.interfaces.QuantizationMethod` classes under the
    ``quant_method`` name used in HF ``quantization_config``."""


@hookspec
def register_structured_output_backends(register: Register) -> None:
    """Register :class:`kvserve.interfaces.StructuredOutputBackend` classes under the name
    ``structured_outputs_config.backend`` selects (facts: ``priority``, ``unavailable``)."""


@hookspec
def register_tool_parsers(register: Register) -> None:
    """Register :class:`kvserve.interfaces.ToolParser` classes under the name ``--tool-call-parser``
    selects (facts: ``contract``, the contract subclass holding the format's canned replies)."""


@hookspec
def register_proposers(register: Register) -> None:
    """Register :class:`kvserve.interfaces.DraftProposer` classes under the name
    ``speculative_config["method"]`` selects (speculative decoding)."""


@hookspec
def register_reasoning_parsers(register: Register) -> None:
    """Register :class:`kvserve.interfaces.ReasoningParser` classes under the name ``--reasoning-parser`` selects."""


@hookspec
def register_gguf_architectures(register: Register) -> None:
    """Register :class:`kvserve.interfaces.GGUFArchitecture` classes under the GGUF ``general.architecture``
    name (``"llama"``) whose files they read: the model plugin implementing an architecture says how
    llama.cpp's files of it map onto the HF checkpoint (q/k row order, folded constants, dropped config)."""


@hookspec
def register_lora_resolvers(register: Register) -> None:
    """Register :class:`kvserve.interfaces.LoRAResolver` classes: with ``allow_runtime_lora_updating``
    the server asks each (facts: ``priority``, higher first) for an adapter a request names that it does
    not serve yet."""
