"""Speculative decoding's counters: as Prometheus metrics (vLLM's ``spec_decode_*`` names) and the
periodic log line."""

from __future__ import annotations

import logging

from prometheus_client.parser import text_string_to_metric_families

from kvserve.engine.stats import EngineStats, StatLogger
from kvserve.interfaces import KVCacheStats
from kvserve.server.metrics import ServerMetrics
from kvserve.spec_decode.speculator import SpecDecodeStats


def recorded() -> SpecDecodeStats:
    stats = SpecDecodeStats()
    stats.record(4, 4)
    stats.record(4, 1)
    stats.record(2, 0)
    return stats


def engine_stats(spec: SpecDecodeStats | None) -> EngineStats:
    kv = KVCacheStats(num_blocks=8, num_free_blocks=8)
    return EngineStats(1, 0, kv, 10, 20, 0, spec)


def test_counters_add_up_per_position():
    stats = recorded()
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 10, 5)
    assert stats.accepted_per_position == [2, 1, 1, 1]


def test_prometheus_exposes_vllms_spec_decode_counters_only_when_on():
    samples = {}
    for family in text_string_to_metric_families(ServerMetrics(lambda: engine_stats(recorded())).render().decode()):
        for sample in family.samples:
            samples[(sample.name, sample.labels.get("position"))] = sample.value
    assert samples[("kvserve:spec_decode_num_drafts_total", None)] == 3
    assert samples[("kvserve:spec_decode_num_draft_tokens_total", None)] == 10
    assert samples[("kvserve:spec_decode_num_accepted_tokens_total", None)] == 5
    per_position = [samples[("kvserve:spec_decode_num_accepted_tokens_per_pos_total", str(p))] for p in range(4)]
    assert per_position == [2, 1, 1, 1]
    assert b"spec_decode" not in ServerMetrics(lambda: engine_stats(None)).render()


def test_the_log_line_reports_the_windows_acceptance(monkeypatch, caplog):
    monkeypatch.setenv("KVSERVE_STATS_INTERVAL", "0")
    logger = StatLogger()
    with caplog.at_level(logging.INFO, logger="kvserve"):
        logger.maybe_log(lambda: engine_stats(recorded()))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("SpecDecoding metrics"))
    assert "Mean acceptance length: 2.67" in line and "Accepted: 5 tokens, Drafted: 10 tokens" in line
    assert "Per-position acceptance rate: 0.667, 0.333, 0.333, 0.333" in line and "rate: 50.0%" in line
