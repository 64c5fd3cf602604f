"""The engine's side of structured outputs, driven through ``LLM`` with backends registered here.

The backends are small but real: ``trie`` compiles a ``choice`` constraint into a trie of the
choices' token ids (EOS allowed exactly where a choice is complete), on the engine's worker thread.
Markers in the choices make its compilation slow or fail, or its matcher reach a state that
allows nothing; ``picky`` refuses every constraint at validation, so ``auto`` falls back past it.
"""

from __future__ import annotations

import textwrap

import pytest

from kvserve import LLM, SamplingParams
from kvserve.plugins import get_plugin_manager
from kvserve.structured_outputs import StructuredOutputsParams
from kvserve.testing.hf_models import build_tiny_model

PLUGIN = '''
import threading

import numpy as np
import torch

from kvserve import hookimpl
from kvserve.interfaces import LogitsConstraint, StructuredOutputBackend

compile_threads = []
gate = threading.Event()  # a "slow" choice compiles once the test opens it


class TrieMatcher(LogitsConstraint):
    """Walks a trie of token ids; EOS ends a complete choice."""

    def __init__(self, trie, eos, vocab_size, dead_end):
        self.trie, self.eos, self.vocab_size, self.dead_end = trie, eos, vocab_size, dead_end
        self.path = []

    def _node(self):
        node = self.trie
        for token in self.path:
            node = node[token]
        return node

    def fill_bitmask(self, bitmask, row):
        allowed = np.zeros(bitmask.shape[1] * 32, dtype=bool)
        node = self._node()
        if not (self.dead_end and self.path):  # a dead end allows nothing: a grammar failing at runtime
            allowed[[t for t in node if t != "end"] + (list(self.eos) if "end" in node else [])] = True
        bitmask[row] = torch.from_numpy(np.packbits(allowed, bitorder="little").view(np.int32))

    def accept_tokens(self, token_ids):
        for token in token_ids:
            node = self._node()
            if token in self.eos and "end" in node:
                self.path.append("end")
                continue
            if token not in node or token == "end":
                return False
            self.path.append(token)
        return True

    def is_terminated(self):
        return bool(self.path) and self.path[-1] == "end"

    def rollback(self, num_tokens):
        del self.path[len(self.path) - num_tokens :]

    def reset(self):
        self.path = []


class TrieBackend(StructuredOutputBackend):
    name = "trie"

    def __init__(self, tokenizer, vocab_size, eos_token_ids, config):
        self.tokenizer, self.vocab_size, self.eos = tokenizer, vocab_size, eos_token_ids

    @classmethod
    def validate(cls, params, config):
        if params.kind != "choice":
            raise ValueError(f"structured_outputs.{params.kind}: trie compiles choice only")

    def compile(self, params):
        compile_threads.append(threading.current_thread().name)
        if "slow" in params.choice:
            gate.wait(timeout=60)
        if "boom" in params.choice:
            raise ValueError("boom is not a choice")
        trie = {}
        for choice in params.choice:
            node = trie
            for token in self.tokenizer.encode(choice, add_special_tokens=False):
                node = node.setdefault(token, {})
            node["end"] = {}
        return trie, "dead" in params.choice

    def matcher(self, compiled):
        trie, dead_end = compiled
        return TrieMatcher(trie, self.eos, self.vocab_size, dead_end)


class PickyBackend(TrieBackend):
    name = "picky"

    @classmethod
    def validate(cls, params, config):
        raise ValueError("picky compiles nothing")


@hookimpl
def register_structured_output_backends(register):
    register("picky", "seam_so_plugins:PickyBackend", priority=1001)  # tried before any installed backend
    register("trie", "seam_so_plugins:TrieBackend", priority=1000)
'''

CHOICES = ["red apple", "green pear", "blue plum"]


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    path = tmp_path_factory.mktemp("so-plugins")
    (path / "seam_so_plugins.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.syspath_prepend(str(path))
    import seam_so_plugins

    get_plugin_manager.cache_clear()
    get_plugin_manager().add_plugin(seam_so_plugins, "seam_so_plugins", "seam-so-plugins", "0.1")
    yield seam_so_plugins
    monkeypatch.undo()
    get_plugin_manager.cache_clear()


@pytest.fixture(scope="module")
def llm(backends, tmp_path_factory):
    model = build_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))
    return LLM(str(model), dtype="float32", max_model_len=128, num_kv_blocks=64, block_size=8)


def choice(*choices: str, seed: int, **fields) -> SamplingParams:
    constraint = StructuredOutputsParams(choice=list(choices))
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=24, structured_outputs=constraint, **fields)


def test_choices_come_out_whole_and_stop(llm, backends):
    outputs = llm.generate(["Fruit:"] * 6, [choice(*CHOICES, seed=s) for s in range(6)], use_tqdm=False)
    for out in outputs:
        assert out.outputs[0].text in CHOICES, out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"
    assert all(name.startswith("kvserve-grammar") for name in backends.compile_threads)  # off the step loop


def test_unconstrained_neighbours_are_untouched(llm):
    plain = SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    alone = llm.generate("The sea", plain, use_tqdm=False)[0].outputs[0].token_ids
    mixed = llm.generate(["The sea", "Fruit:"], [plain, choice(*CHOICES, seed=1)], use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone
    assert mixed[1].outputs[0].text in CHOICES


def test_a_slow_grammar_stalls_no_one(llm, backends):
    """While one grammar compiles, an unconstrained request runs to its end; then the other runs."""
    engine = llm.engine
    backends.gate.clear()
    engine.add_request("slow", engine.check_request([1, 2, 3], choice("slow", "red apple", seed=0)))
    engine.add_request("quick", engine.check_request([1, 2, 3], SamplingParams(max_tokens=8, ignore_eos=True)))
    outputs = []
    while not any(o.finished for o in outputs):
        outputs = engine.step()
        assert all(o.request_id == "quick" for o in outputs)
    backends.gate.set()
    while engine.has_unfinished_requests():
        outputs = engine.step()
    assert [o.request_id for o in outputs] == ["slow"] and outputs[0].outputs[0].text in ("slow", "red apple")


def test_a_grammar_that_fails_to_compile_fails_its_request_only(llm):
    outputs = llm.generate(["a", "b"], [choice("boom", "x", seed=0), choice(*CHOICES, seed=0)], use_tqdm=False)
    assert outputs[0].outputs[0].finish_reason == "abort"
    assert "boom is not a choice" in outputs[0].error
    assert outputs[1].outputs[0].text in CHOICES


def test_a_grammar_that_allows_nothing_fails_its_request_only(llm):
    outputs = llm.generate(["a", "b"], [choice("dead", "deadly", seed=0), choice(*CHOICES, seed=0)], use_tqdm=False)
    assert outputs[0].outputs[0].finish_reason == "abort"
    assert "every token is ruled out" in outputs[0].error
    assert outputs[1].outputs[0].text in CHOICES
    manager = llm.engine.kv_cache_manager
    assert manager.stats().num_free_blocks == llm.engine.num_kv_blocks - 1  # nothing leaked (null block aside)


def test_auto_falls_back_past_a_backend_that_refuses(llm, startup_lines):
    checked = llm.engine.check_request([1, 2], choice(*CHOICES, seed=0))
    assert checked.structured_output_backend == "trie"
    assert any("picky cannot compile this choice" in line for line in startup_lines)


def test_no_backend_accepts_names_every_reason(backends, tmp_path):
    model = build_tiny_model("llama", tmp_path / "m")
    strict = LLM(str(model), dtype="float32", num_kv_blocks=16, structured_outputs_config={"disable_fallback": True})
    with pytest.raises(ValueError, match="picky compiles nothing"):
        strict.generate("x", choice(*CHOICES, seed=0), use_tqdm=False)
    # One "field: why" message, the field first (the server's 400 names it), then each backend's reason.
    every_reason = r"^structured_outputs\.regex: no backend accepts it \(picky: picky compiles nothing; trie: trie comp"
    with pytest.raises(ValueError, match=every_reason):
        llm_regex = SamplingParams(structured_outputs=StructuredOutputsParams(regex="(unclosed"))
        LLM(str(model), dtype="float32", num_kv_blocks=16).generate("x", llm_regex, use_tqdm=False)


def test_with_a_reasoning_parser_the_grammar_holds_after_the_reasoning(backends, tmp_path):
    """deepseek_r1: a prompt that already closed the reasoning is constrained from its first token;
    one still reasoning is not (its tokens are the unconstrained ones of the same seed)."""
    model = build_tiny_model("llama", tmp_path / "m")
    llm = LLM(str(model), dtype="float32", num_kv_blocks=64, block_size=8, reasoning_parser="deepseek_r1")
    tokenizer = llm.engine.tokenizer
    end = tokenizer.encode("</think>", add_special_tokens=False)
    thought = tokenizer.encode("Fruit? Let me think.", add_special_tokens=False)
    answered = llm.generate(thought + end, choice(*CHOICES, seed=5), use_tqdm=False)[0].outputs[0]
    assert answered.text in CHOICES and answered.finish_reason == "stop"
    free = SamplingParams(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    reasoning = llm.generate(thought, choice(*CHOICES, seed=5).model_copy(update={"max_tokens": 6}), use_tqdm=False)
    assert reasoning[0].outputs[0].token_ids == llm.generate(thought, free, use_tqdm=False)[0].outputs[0].token_ids
