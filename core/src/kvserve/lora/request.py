"""``LoRARequest``: which adapter a request runs with, as vLLM's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, id and PEFT directory: ``LoRARequest("sql", 1, "/adapters/sql")``.

    ``lora_int_id`` (``>= 1``) identifies the adapter inside the engine: requests with the same id
    share its slot and their prefix-cache blocks; one id always means one name and one path.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None
    """The model the adapter was trained on, as the server lists it (``parent`` in ``/v1/models``)."""

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_request: lora_name must not be empty")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_request: lora_int_id must be an int >= 1, got {self.lora_int_id!r}")
        if not self.lora_path:
            raise ValueError(f"lora_request: adapter {self.lora_name!r} has no lora_path")
