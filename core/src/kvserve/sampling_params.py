"""Per-request sampling parameters, named and validated as in vLLM."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SamplingParams(BaseModel):
    """How to pick each next token and when to stop.

    ``temperature=0`` is greedy decoding. Invalid values raise a ``ValueError`` naming the field.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1: no top-k filtering")
    seed: int | None = Field(None, description="Per-request seed: the same output whatever the batch")
    max_tokens: int | None = Field(16, ge=1, description="None: until EOS or max_model_len")
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    @model_validator(mode="after")
    def _normalise(self) -> SamplingParams:
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
