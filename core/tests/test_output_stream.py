"""OutputStream: a lagging consumer gets the outputs it missed merged into one, and the end never lost."""

from __future__ import annotations

import asyncio

from kvserve.frontend.output_stream import OutputStream
from kvserve.outputs import CompletionOutput, Logprob, RequestOutput


def _delta(index: int, text: str, token: int, finish: str | None = None, logprobs: bool = False) -> RequestOutput:
    lp = [{token: Logprob(-0.5, 1)}] if logprobs else None
    completion = CompletionOutput(index, text, [token], logprobs=lp, finish_reason=finish)
    return RequestOutput("r", None, [1, 2], [completion], finished=finish is not None)


def test_deltas_the_consumer_has_not_taken_are_merged_in_order() -> None:
    async def main() -> None:
        collector = OutputStream(delta=True)
        collector.put(_delta(0, "a", 10, logprobs=True))
        collector.put(_delta(1, "x", 20))  # another of the n completions
        collector.put(_delta(0, "b", 11, logprobs=True))
        first = await collector.get()
        assert [(c.index, c.text, c.token_ids) for c in first.outputs] == [(0, "ab", [10, 11]), (1, "x", [20])]
        assert [list(p) for p in first.outputs[0].logprobs] == [[10], [11]] and not first.finished
        collector.put(_delta(0, "c", 12, finish="length"))
        last = await collector.get()
        assert last.outputs[0].text == "c" and last.outputs[0].finish_reason == "length" and last.finished

    asyncio.run(main())


def test_a_cumulative_output_supersedes_and_an_exception_wins() -> None:
    async def main() -> None:
        collector = OutputStream(delta=False)
        collector.put(_delta(0, "a", 10))
        collector.put(_delta(0, "ab", 11))
        assert (await collector.get()).outputs[0].text == "ab"
        collector.put(RuntimeError("engine died"))
        collector.put(_delta(0, "abc", 12))  # too late: the stream ends with the error
        assert isinstance(await collector.get(), RuntimeError)

    asyncio.run(main())


def test_get_waits_for_the_next_output() -> None:
    async def main() -> None:
        collector = OutputStream(delta=True)
        waiter = asyncio.ensure_future(collector.get())
        await asyncio.sleep(0)
        assert not waiter.done()
        collector.put(_delta(0, "a", 10))
        assert (await waiter).outputs[0].text == "a"

    asyncio.run(main())
