"""``ParentRequest``: ``n > 1`` fanned out into single-sample children, their outputs merged back."""

import pytest

from kvserve.engine.validation import CheckedRequest
from kvserve.frontend.parallel_sampling import ParentRequest, ParentStream
from kvserve.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvserve.sampling_params import SamplingParams

PROMPT_LOGPROBS = [None, {7: None}]


def parent(output_kind: str, **fields) -> ParentRequest:
    params = SamplingParams(n=3, seed=10, prompt_logprobs=1, output_kind=output_kind, **fields)
    return ParentRequest("p", CheckedRequest([1, 7], params, [], priority=2, prompt="hi"))


def child_output(index: int, text: str, finish: str | None = None, error: str | None = None, at: float = 1.0):
    """A delta output of child ``index``: ``text`` new, one token per character."""
    return RequestOutput(
        request_id=f"{index}_p",
        prompt="hi",
        prompt_token_ids=[1, 7],
        outputs=[CompletionOutput(0, text, [ord(c) for c in text], finish_reason=finish)],
        finished=finish is not None,
        prompt_logprobs=PROMPT_LOGPROBS if index == 0 else None,
        metrics=RequestMetrics(arrival_time=at, first_token_time=at + 1, finished_time=at + 2 if finish else None),
        error=error,
    )


def test_children_sample_with_their_own_seed_and_only_the_first_asks_for_prompt_logprobs():
    children = parent("cumulative").children
    assert list(children) == ["0_p", "1_p", "2_p"]
    assert [c.params.seed for c in children.values()] == [10, 11, 12]
    assert {(c.params.n, c.params.output_kind) for c in children.values()} == {(1, "delta")}
    assert [c.params.prompt_logprobs for c in children.values()] == [1, None, None]
    assert [c.after_prompt_of for c in children.values()] == [None, "0_p", "0_p"]
    assert {(c.priority, c.prompt, tuple(c.prompt_token_ids)) for c in children.values()} == {(2, "hi", (1, 7))}


def test_cumulative_outputs_hold_every_sample_so_far():
    request = parent("cumulative")
    first = request.add(child_output(1, "ab"))
    assert [(c.index, c.text) for c in first.outputs] == [(0, ""), (1, "ab"), (2, "")]
    assert first.request_id == "p" and not first.finished
    request.add(child_output(0, "x", "stop"))
    request.add(child_output(2, "yz", "length"))
    last = request.add(child_output(1, "c", "stop", at=0.5))
    assert [(c.index, c.text, c.token_ids, c.finish_reason) for c in last.outputs] == [
        (0, "x", [120], "stop"), (1, "abc", [97, 98, 99], "stop"), (2, "yz", [121, 122], "length"),
    ]  # fmt: skip
    assert first.outputs[1].token_ids == [97, 98], "an output already handed out does not change"
    assert last.finished and last.prompt_logprobs == PROMPT_LOGPROBS
    assert (last.metrics.arrival_time, last.metrics.first_token_time, last.metrics.finished_time) == (0.5, 1.5, 3.0)


def test_delta_outputs_hold_only_the_new_part_and_the_prompt_logprobs_once():
    request = parent("delta")
    first = request.add(child_output(0, "a"))
    assert [(c.index, c.text) for c in first.outputs] == [(0, "a")] and first.prompt_logprobs == PROMPT_LOGPROBS
    second = request.add(child_output(2, "b", "stop"))
    assert [(c.index, c.text) for c in second.outputs] == [(2, "b")] and second.prompt_logprobs is None
    assert not request.add(child_output(0, "c", "stop")).finished
    assert request.add(child_output(1, "d", "length")).finished


def test_final_only_waits_for_every_sample():
    request = parent("final_only")
    assert request.add(child_output(0, "a", "stop")) is None
    assert request.add(child_output(2, "b", "stop")) is None
    assert request.add(child_output(1, "c")) is None
    final = request.add(child_output(1, "d", "length"))
    assert final.finished and [c.text for c in final.outputs] == ["a", "cd", "b"]
    assert request.unfinished_children() == []


@pytest.mark.parametrize("kind", ["cumulative", "delta", "final_only"])
def test_a_failed_sample_fails_the_parent_and_the_others_are_to_be_aborted(kind):
    request = parent(kind)
    request.add(child_output(0, "a", "stop"))
    request.add(child_output(2, "xy"))
    failed = request.add(child_output(1, "", "abort", error="boom"))
    assert failed.finished and failed.error == "boom"
    finishes = {c.index: c.finish_reason for c in failed.outputs}
    assert finishes[1] == "abort" and finishes[2] == "abort"
    if kind != "delta":
        assert [c.text for c in failed.outputs] == ["a", "", "xy"], "each sample as far as it got"
    assert request.unfinished_children() == ["2_p"]
    assert request.add(child_output(2, "late", "stop")) is None, "the parent has ended"
    assert request.unfinished_children() == []


def test_the_parents_stream_merges_child_outputs_and_passes_exceptions_on():
    class Target:
        def __init__(self):
            self.items = []

        def put(self, item):
            self.items.append(item)

    target = Target()
    stream = ParentStream(parent("final_only"), target)
    stream.put(child_output(0, "a", "stop"))
    assert target.items == []
    error = RuntimeError("engine died")
    stream.put(error)
    assert target.items == [error]


def test_each_sample_keeps_its_own_logprobs():
    request = ParentRequest("p", CheckedRequest([1, 7], SamplingParams(n=2, logprobs=0, output_kind="final_only"), []))
    for index, token in ((0, 5), (1, 6), (0, 8)):
        delta = CompletionOutput(0, "t", [token], cumulative_logprob=-1.0, logprobs=[{token: None}])
        request.add(RequestOutput(f"{index}_p", None, [1, 7], [delta], finished=False))
    final = request.add(RequestOutput("1_p", None, [1, 7], [CompletionOutput(0, "", [], finish_reason="stop")], True))
    assert final is None, "sample 0 has not finished"
    final = request.add(RequestOutput("0_p", None, [1, 7], [CompletionOutput(0, "", [], finish_reason="stop")], True))
    assert [c.token_ids for c in final.outputs] == [[5, 8], [6]]
    assert [[list(lp) for lp in c.logprobs] for c in final.outputs] == [[[5], [8]], [[6]]]
