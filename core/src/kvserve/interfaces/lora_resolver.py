"""The LoRAResolver interface: finds the adapter a request names when the server does not serve it yet.

With ``allow_runtime_lora_updating`` on, a request whose ``model`` is neither the served model nor a
loaded adapter is not refused at once: the server asks each registered resolver in turn
(``register_lora_resolvers``, as vLLM's ``lora_resolvers``) and loads the first adapter one finds,
then serves the request (and every later one) with it. A resolver may fetch the adapter first (from
a model hub, an object store) into a local directory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the interfaces package does not import the server's config at run time
    from kvserve.config import ServerConfig
    from kvserve.lora.request import LoRARequest


class LoRAResolver(ABC):
    """Maps an adapter's name to a local PEFT adapter directory.

    The server builds each registered resolver once, ``cls(server_config)``, when it starts with
    ``allow_runtime_lora_updating``, and calls :meth:`resolve_lora` from its event loop, one call at a
    time. The contract (``kvserve.testing.LoRAResolverContract``) checks that known names resolve to
    their own adapter and that unknown or unsafe names give None.
    """

    name: ClassVar[str]
    """The registry name (``kvserve plugins`` lists it)."""

    def __init__(self, config: ServerConfig) -> None:
        """Keep the server's config (:attr:`config`): a resolver reads its settings there (the built-in
        ``filesystem`` resolver its ``lora_resolver_cache_dir``) or from its own environment variables."""
        self.config = config

    @abstractmethod
    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        """The adapter named ``lora_name`` for the model served as ``base_model_name``, or None when this
        resolver knows no such adapter.

        The answer's ``lora_name`` is ``lora_name`` and its ``lora_path`` a local directory holding the
        adapter (``adapter_config.json`` and the weights); its ``lora_int_id`` is replaced by the
        server's own. A name that could reach outside the resolver's own store (``..``, a path
        separator, an absolute path) gives None. Never raise for an unknown name; an error of the store
        itself may raise (the server logs it and asks the next resolver). Do slow work (downloads, file
        reads) without blocking the event loop, e.g. with ``asyncio.to_thread``. The server checks the
        adapter's weights against the model when it loads it: the resolver need not.
        """
