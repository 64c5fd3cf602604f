"""Incremental detokenization on a SentencePiece-style (Metaspace) tokenizer."""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from kvserve.engine.detokenizer import IncrementalDetokenizer


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=["<s>", "</s>"])
    tok.train_from_iterator(["hello world, the quick brown fox jumps"] * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def test_first_generated_word_keeps_its_leading_space_after_the_prompt():
    tokenizer = metaspace_tokenizer()
    prompt, generated = tokenizer.encode("hello world,"), tokenizer.encode("the quick brown fox")
    full = tokenizer.decode(prompt + generated)
    expected = full[len(tokenizer.decode(prompt)) :]
    assert expected.startswith(" the")
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True, prompt_token_ids=prompt)
    assert "".join(detokenizer.add(t) for t in generated) == expected == detokenizer.text
