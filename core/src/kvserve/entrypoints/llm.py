"""``LLM``: offline batched generation, shaped like vLLM's."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from kvserve.chat_template import render_chat
from kvserve.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams

Prompt = str | list[int]
Message = dict[str, str]


class LLM:
    """An engine for offline use: ``LLM(model=PATH, max_num_seqs=...).generate(prompts, params)``.

    Keyword arguments are :class:`~kvserve.config.EngineConfig` fields by their flat names;
    ``model=None`` uses the embedded SmolLM2-135M-Instruct.
    """

    def __init__(self, model: str | None = None, **config_fields: Any) -> None:
        self.config = EngineConfig.from_flat(model=model, **config_fields)
        self.engine = LLMEngine(self.config)
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False if some are still in use."""
        return self.engine.reset_prefix_cache()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs come back in input order.

        If any prompt is invalid nothing is queued and the error names it.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"sampling_params: {len(sampling_params)} given for {len(prompts)} prompts")
        priority = list(priority) if priority is not None else [0] * len(prompts)
        tokenizer = self.engine.tokenizer
        encoded = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]

        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        try:
            for request_id, prompt, token_ids, params, prio in zip(ids, prompts, encoded, sampling_params, priority):
                params = params.model_copy(update={"output_kind": "final_only"})
                text = prompt if isinstance(prompt, str) else None
                self.engine.add_request(request_id, token_ids, params, prio, prompt=text)
        except Exception:
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation or a list of them, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        rendered = [render_chat(self.engine.tokenizer, conv) for conv in conversations]  # type: ignore[arg-type]
        prompts = [text for text, _ in rendered]
        token_ids = [ids for _, ids in rendered]
        outputs = self.generate(token_ids, sampling_params, use_tqdm)
        for output, prompt in zip(outputs, prompts):
            output.prompt = prompt  # the templated text, as vLLM reports it
        return outputs

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="Generating", disable=not use_tqdm, unit="req") as bar:
            while len(results) < len(ids):
                if not self.engine.has_unfinished_requests():
                    raise RuntimeError(f"engine stopped with {len(ids) - len(results)} requests unanswered")
                for output in self.engine.step():
                    if output.finished:
                        results[output.request_id] = output
                        bar.update(1)
        return [results[i] for i in ids]
