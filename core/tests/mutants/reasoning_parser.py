"""Deliberately broken copies of core's ``deepseek_r1`` reasoning parser: each breaks one rule of the
reasoning parser contract.

Test fixtures for ``core/tests/test_reasoning_contract_mutants.py``, which asserts that the contract
fails each of them with a message naming the broken behaviour.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kvserve.reasoning import DeepSeekR1ReasoningParser


class EndTagWithinDelta(DeepSeekR1ReasoningParser):
    """Looks for ``</think>`` in each delta alone, holding nothing back: a tag cut between two deltas is
    streamed as reasoning text."""

    name = "deepseek_r1_end_tag_within_delta"

    def _take_until(self, tag: str) -> tuple[str, bool]:
        before, found, after = self._pending.partition(tag)
        self._pending = after if found else ""
        return before, bool(found)


class DropsHeldText(DeepSeekR1ReasoningParser):
    """Forgets the text it held back as a possible tag when the output ends (``"... </thi"``)."""

    name = "deepseek_r1_drops_held_text"

    def finish_streaming(self) -> tuple[str | None, str | None]:
        super().finish_streaming()
        return None, None


class SharedStream(DeepSeekR1ReasoningParser):
    """Keeps the held-back text on the class: every parser of the process streams into one buffer."""

    name = "deepseek_r1_shared_stream"
    held: ClassVar[dict[str, Any]] = {}

    @property
    def _pending(self) -> str:
        return SharedStream.held.get("text", "")

    @_pending.setter
    def _pending(self, text: str) -> None:
        SharedStream.held["text"] = text
