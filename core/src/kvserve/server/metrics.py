"""Prometheus metrics, named like vLLM's (``kvserve:`` for ``vllm:``) so existing dashboards carry over.

Request-level latencies are observed as outputs stream through the server; engine state
(queues, KV blocks, prefix cache, token and preemption totals) is read from
``AsyncLLM.stats()`` at scrape time (the snapshot of the latest step when the engine core has
its own process). Each app has its own registry, so several servers can live in one process.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvserve.engine.stats import EngineStats
from kvserve.outputs import RequestOutput

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)


class EngineCollector(Collector):
    """Engine gauges and counters, read when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        kv = stats.kv_cache
        gauges = {
            "num_requests_running": ("Requests in the running batch.", stats.num_running),
            "num_requests_waiting": ("Requests waiting to be scheduled.", stats.num_waiting),
            "kv_cache_usage_perc": ("Fraction of KV cache blocks in use (0-1).", kv.usage),
            "kv_cache_free_blocks": ("KV blocks no request holds (prefix-cached ones included).", kv.num_free_blocks),
            "kv_cache_total_blocks": ("Usable KV cache blocks.", kv.num_blocks),
            "prefix_cache_hit_rate": ("Fraction of looked-up prompt tokens found cached.", kv.prefix_hit_rate),
        }
        for name, (documentation, value) in gauges.items():
            yield GaugeMetricFamily(f"kvserve:{name}", documentation, value=value)
        counters = {
            "prompt_tokens": ("Prompt tokens prefilled.", stats.prompt_tokens_total),
            "generation_tokens": ("Tokens generated.", stats.generation_tokens_total),
            "num_preemptions": ("Requests preempted to free KV blocks.", stats.preemptions_total),
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.", kv.prefix_queries),
            "prefix_cache_hits": ("Looked-up prompt tokens found in the prefix cache.", kv.prefix_hits),
        }
        spec = stats.spec_decode
        if spec is not None:  # vLLM's spec_decode_* counters, while speculative decoding is on
            counters |= {
                "spec_decode_num_drafts": ("Verification steps of a request with drafts.", spec.num_drafts),
                "spec_decode_num_draft_tokens": ("Draft tokens verified.", spec.num_draft_tokens),
                "spec_decode_num_accepted_tokens": ("Draft tokens accepted.", spec.num_accepted_tokens),
            }
        for name, (documentation, value) in counters.items():
            yield CounterMetricFamily(f"kvserve:{name}", documentation, value=value)
        if spec is not None:
            per_position = CounterMetricFamily(
                "kvserve:spec_decode_num_accepted_tokens_per_pos",
                "Draft tokens accepted at each draft position.",
                labels=["position"],
            )
            for position, value in enumerate(spec.accepted_per_position):
                per_position.add_metric([str(position)], value)
            yield per_position
        if stats.lora is not None:  # vLLM's: the labels carry the state, the value the time of the snapshot
            info = GaugeMetricFamily(
                "kvserve:lora_requests_info",
                "LoRA adapters of the running and of the waiting requests (comma-separated), and max_lora.",
                labels=["running_lora_adapters", "max_lora", "waiting_lora_adapters"],
            )
            lora = stats.lora
            info.add_metric([",".join(lora.running), str(lora.max_loras), ",".join(lora.waiting)], time.time())
            yield info


class ServerMetrics:
    """The registry behind ``GET /metrics``."""

    def __init__(self, engine_stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.http_requests = Counter(
            "kvserve:http_requests", "HTTP requests by route and status.", ["path", "status"], registry=registry
        )
        self.request_success = Counter(
            "kvserve:request_success", "Finished completions by finish reason.", ["finished_reason"], registry=registry
        )
        self.ttft = Histogram(
            "kvserve:time_to_first_token_seconds", "Time to first token.", buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.itl = Histogram(
            "kvserve:inter_token_latency_seconds", "Time between a streamed request's outputs.",
            buckets=_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.lora_requests = Counter(
            "kvserve:lora_requests", "Generation requests admitted per LoRA adapter.", ["lora_name"], registry=registry
        )
        self.e2e = Histogram(
            "kvserve:e2e_request_latency_seconds", "Arrival to last token.", buckets=_E2E_BUCKETS, registry=registry
        )
        registry.register(EngineCollector(engine_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def observe(self, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        """Pass ``outputs`` through, timing the first token, the gaps between outputs and the whole request.

        A request answered whole (``final_only``) has one output: its time to first token comes from the
        engine's timestamps, and it has no gaps between outputs to observe.
        """
        start = last = time.monotonic()
        first = True
        async with aclosing(outputs):  # closing this generator early closes (aborts) the engine request too
            async for output in outputs:
                now = time.monotonic()
                if not first:
                    self.itl.observe(now - last)
                elif output.finished and (times := output.metrics) is not None and times.first_token_time:
                    self.ttft.observe(times.first_token_time - times.arrival_time)
                else:
                    self.ttft.observe(now - last)
                first, last = False, now
                for completion in output.outputs:
                    if completion.finish_reason is not None:
                        self.request_success.labels(completion.finish_reason).inc()
                if output.finished:
                    self.e2e.observe(now - start)
                yield output


class HttpMetricsMiddleware:
    """Counts every HTTP response by route (known paths only, to bound label values) and status."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, paths: set[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in self.paths else "unmatched"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http_requests.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
