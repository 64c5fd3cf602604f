"""``LLM``: offline batched generation, shaped like vLLM's."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from kvserve.chat_template import render_chat
from kvserve.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.frontend.parallel_sampling import ParentRequest
from kvserve.lora.request import LoRARequest
from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams

Prompt = str | list[int] | dict[str, Any]
"""Text, token ids, ``{"prompt": text}`` or ``{"prompt_token_ids": ids}`` (vLLM's prompt forms)."""
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

    def get_default_sampling_params(self) -> SamplingParams:
        """What :meth:`generate` and :meth:`chat` sample with when given no ``sampling_params``: the
        model's generation config defaults (``generation_config``, ``override_generation_config``) over
        SamplingParams' own, as vLLM's ``LLM.get_default_sampling_params``."""
        return SamplingParams(**self.engine.default_sampling_fields)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False if some are still in use."""
        return self.engine.reset_prefix_cache()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (see :data:`Prompt`); outputs come back in input order.

        Without ``sampling_params`` every prompt gets :meth:`get_default_sampling_params`.
        ``lora_request``: one adapter for every prompt, or one (or None: the base model) per prompt;
        needs ``enable_lora``, and each adapter is read and checked before anything is queued. If any
        prompt is invalid nothing is queued and the error names it (a TypeError or
        ValueError naming the prompt's index). A request the engine failed comes back finished
        with ``finish_reason="abort"`` and ``RequestOutput.error``; if the engine itself
        stops, EngineDeadError is raised.
        """
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or self.get_default_sampling_params()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"sampling_params: {len(sampling_params)} given for {len(prompts)} prompts")
        priority = list(priority) if priority is not None else [0] * len(prompts)
        lora_request = _one_per_prompt(lora_request, len(prompts))
        parsed = [self._parse_prompt(i, p, lora) for i, (p, lora) in enumerate(zip(prompts, lora_request))]
        requests = [  # every prompt checked, once, before any is queued
            self.engine.check_request(
                token_ids,
                params.model_copy(update={"output_kind": "final_only"}),
                prompt=text,
                priority=prio,
                lora_request=lora,
            )  # fmt: skip
            for (text, token_ids), params, prio, lora in zip(parsed, sampling_params, priority, lora_request)
        ]
        for lora in dict.fromkeys(r.lora_request for r in requests if r.lora_request is not None):
            self.engine.load_lora(lora)
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        parents: dict[str, ParentRequest] = {}  # engine request id -> the n > 1 request it is a sample of
        for request_id, request in zip(ids, requests):
            if request.params.n == 1:
                self.engine.add_request(request_id, request)
                continue
            parent = ParentRequest(request_id, request)
            for child_id, child in parent.children.items():
                parents[child_id] = parent
                self.engine.add_request(child_id, child)
        return self._run(ids, parents, use_tqdm)

    def _parse_prompt(self, index: int, prompt: Any, lora_request: LoRARequest | None) -> tuple[str | None, list[int]]:
        """``(text or None, token ids)`` of prompt ``index`` in any of the :data:`Prompt` forms; text
        through the tokenizer of ``lora_request`` (its adapter's own where it ships one)."""
        if isinstance(prompt, dict):
            keys = set(prompt)
            if keys == {"prompt"}:
                prompt = prompt["prompt"]
            elif keys == {"prompt_token_ids"}:
                prompt = prompt["prompt_token_ids"]
                if isinstance(prompt, str):
                    raise TypeError(f"prompts[{index}]: 'prompt_token_ids' must be a list of token ids, not text")
            else:
                raise ValueError(
                    f"prompts[{index}]: a prompt dict has either 'prompt' (text) or 'prompt_token_ids', "
                    f"got keys {sorted(keys)}"
                )
        if isinstance(prompt, str):
            return prompt, self.engine.tokenizers.of(lora_request).encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise TypeError(
            f"prompts[{index}]: a prompt is text, a list of token ids, {{'prompt': text}} or "
            f"{{'prompt_token_ids': ids}}; got {type(prompt).__name__}"
        )

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation or a list of them, then generate
        (with ``lora_request`` as :meth:`generate` takes it; an adapter that ships a tokenizer renders
        its conversations with that tokenizer's template)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        lora_request = _one_per_prompt(lora_request, len(conversations))
        rendered = [
            render_chat(self.engine.tokenizers.of(lora), conv) for conv, lora in zip(conversations, lora_request)
        ]
        prompts = [text for text, _ in rendered]
        token_ids = [ids for _, ids in rendered]
        outputs = self.generate(token_ids, sampling_params, use_tqdm, lora_request=lora_request)
        for output, prompt in zip(outputs, prompts):
            output.prompt = prompt  # the templated text, as vLLM reports it
        return outputs

    def _run(self, ids: list[str], parents: dict[str, ParentRequest], use_tqdm: bool) -> list[RequestOutput]:
        """Step until every request in ``ids`` has its final output (samples of an ``n > 1`` request
        merged into its own: ``parents``)."""
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="Generating", disable=not use_tqdm, unit="req") as bar:
            while len(results) < len(ids):
                if not self.engine.has_unfinished_requests():
                    raise RuntimeError(f"engine stopped with {len(ids) - len(results)} requests unanswered")
                for output in self.engine.step():
                    parent = parents.get(output.request_id)
                    if parent is not None:
                        output = parent.add(output)
                        if output is None:
                            continue
                        for child_id in parent.unfinished_children():  # one sample failed: the others stop
                            self.engine.abort_request(child_id)
                    if output.finished:
                        results[output.request_id] = output
                        bar.update(1)
        return [results[i] for i in ids]


def _one_per_prompt(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, num_prompts: int
) -> list[LoRARequest | None]:
    """``lora_request`` as one entry per prompt (one adapter, or None, for all of them); ValueError when a
    list has another length."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if len(lora_request) != num_prompts:
        raise ValueError(f"lora_request: {len(lora_request)} given for {num_prompts} prompts")
    return list(lora_request)
