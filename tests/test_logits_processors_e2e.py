"""Batch-level logits processors through the engine: configured by name, by "module:Class" and as a
class, opted into per request, matching HF's ``no_repeat_ngram_size``; bad config and params named."""

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError
from kvserve.sampling.no_repeat_ngram import NoRepeatNGramLogitsProcessor
from kvserve.testing.hf_models import build_tiny_model

PROMPT = "the cat sat on the mat and the cat"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("logits_processors"))


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(
        str(model_dir), dtype="float32", max_model_len=128, num_kv_blocks=64, block_size=16,
        logits_processors=["no_repeat_ngram"],
    )  # fmt: skip


def test_no_repeat_ngram_matches_hf_greedy_while_other_rows_are_untouched(llm, model_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = llm.get_tokenizer().encode(PROMPT)
    plain = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    banned = plain.model_copy(update={"extra_args": {"no_repeat_ngram_size": 2}})
    outs = llm.generate([ids, ids, ids], [plain, banned, plain], use_tqdm=False)
    with torch.no_grad():
        expected = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, no_repeat_ngram_size=2)
        unconstrained = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    assert list(outs[1].outputs[0].token_ids) == expected[0, len(ids) :].tolist()
    assert list(outs[0].outputs[0].token_ids) == list(outs[2].outputs[0].token_ids)
    assert list(outs[0].outputs[0].token_ids) == unconstrained[0, len(ids) :].tolist()
    sequence = ids + list(outs[1].outputs[0].token_ids)
    for end in range(len(ids), len(sequence)):  # no generated token completes an earlier bigram
        earlier = set(zip(sequence[: end - 1], sequence[1:end]))
        assert (sequence[end - 1], sequence[end]) not in earlier


def test_bad_extra_args_are_refused_naming_the_field(llm):
    with pytest.raises(ValueError, match="extra_args.no_repeat_ngram_size"):
        llm.generate(PROMPT, SamplingParams(extra_args={"no_repeat_ngram_size": 0}), use_tqdm=False)
    assert llm.generate(PROMPT, SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize(
    "entry", ["kvserve.sampling.no_repeat_ngram:NoRepeatNGramLogitsProcessor", NoRepeatNGramLogitsProcessor]
)
def test_a_processor_can_be_named_by_path_or_given_as_a_class(model_dir, entry):
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64, num_kv_blocks=16, logits_processors=[entry])
    out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=12, extra_args={"no_repeat_ngram_size": 1}))
    tokens = list(out[0].outputs[0].token_ids)
    assert len(tokens) == len(set(tokens))


@pytest.mark.parametrize(
    "entry,message",
    [
        ("no_such_processor", r"logits_processors\[0\]: unknown logits processor 'no_such_processor'"),
        ("no.such.module:Thing", r"logits_processors\[0\]: cannot import"),
        (dict, r"logits_processors\[0\]: .* is not a kvserve.interfaces.LogitsProcessor subclass"),
    ],
)
def test_a_bad_processor_entry_is_a_config_error_naming_it(model_dir, entry, message):
    with pytest.raises(ConfigError, match=message):
        LLM(str(model_dir), dtype="float32", max_model_len=64, num_kv_blocks=16, logits_processors=[entry])
