"""Multi-LoRA: many PEFT adapters served from one base model, mixed in one batch (see docs/lora.md)."""

from kvserve.lora.request import LoRARequest

__all__ = ["LoRARequest"]
