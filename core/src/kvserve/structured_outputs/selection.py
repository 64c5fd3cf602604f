"""Which backend compiles a request's constraint: chosen once, by the front end, at the door."""

from __future__ import annotations

import logging

from kvserve.config import AUTO, StructuredOutputsConfig
from kvserve.errors import PluginError
from kvserve.plugins import get_plugin_manager, load_component
from kvserve.registry import install_hint
from kvserve.sampling_params import StructuredOutputsParams

logger = logging.getLogger("kvserve")


def usable_backends() -> list[str]:
    """The registered backends that can be loaded (their library installed), by priority."""
    registry = get_plugin_manager().registry("structured_output_backend")
    usable = {r.name for r in registry.entries() if r.problem is None and not r.facts.get("unavailable")}
    return [name for name in registry.names() if name in usable]


def candidate_backends(config: StructuredOutputsConfig) -> list[str]:
    """The backends to try in order: the configured one, or under ``auto`` every installed one by
    priority (only the first with ``disable_fallback``)."""
    if config.backend != AUTO:
        return [config.backend]
    ordered = usable_backends()
    if not ordered:
        registry = get_plugin_manager().registry("structured_output_backend")
        unavailable = [f"{r.name} ({r.facts.get('unavailable') or r.problem})" for r in registry.entries()]
        if unavailable:
            raise PluginError(
                f"structured outputs need a usable structured_output_backend plugin; "
                f"installed but unusable: {', '.join(unavailable)}"
            )
        raise PluginError(
            f"structured outputs need a structured_output_backend plugin: {install_hint('structured_output_backend')}"
        )
    return ordered[:1] if config.disable_fallback else ordered


def choose_backend(params: StructuredOutputsParams, config: StructuredOutputsConfig) -> str:
    """The name of the first candidate backend that accepts ``params`` (its ``validate``); ValueError
    with every candidate's reason when none does. Cheap: nothing is compiled against the tokenizer."""
    reasons = []
    for name in candidate_backends(config):
        try:
            load_component("structured_output_backend", name).validate(params, config)
        except ValueError as exc:
            reasons.append((name, str(exc)))
            continue
        if reasons:
            (refused, why), kind = reasons[0], params.kind
            logger.info("structured outputs: %s cannot compile this %s (%s); using %s", refused, kind, why, name)
        return name
    if len(reasons) == 1:
        raise ValueError(reasons[0][1])
    # One "field: why" message (the server names the field from it), each backend's reason inside.
    field = f"structured_outputs.{params.kind}: "
    why = "; ".join(f"{name}: {reason.removeprefix(field)}" for name, reason in reasons)
    raise ValueError(f"{field}no backend accepts it ({why})")
