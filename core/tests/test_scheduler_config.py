"""SchedulerConfig: the per-request prefill cap, the time-aware prefill limit, and their refusals."""

from __future__ import annotations

import pytest

from kvserve.config import SERVING_MAX_DECODE_SLOWDOWN, EngineConfig
from kvserve.errors import ConfigError


def test_the_cap_is_off_by_default_and_takes_strings():
    assert EngineConfig().scheduler.long_prefill_token_threshold == 0
    assert EngineConfig.from_flat(long_prefill_token_threshold="64").scheduler.long_prefill_token_threshold == 64


def test_a_cap_without_chunked_prefill_is_refused_naming_both_fields():
    with pytest.raises(ConfigError, match="long_prefill_token_threshold=64 .* needs enable_chunked_prefill"):
        EngineConfig.from_flat(long_prefill_token_threshold=64, enable_chunked_prefill=False)


def test_a_negative_cap_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="long_prefill_token_threshold"):
        EngineConfig.from_flat(long_prefill_token_threshold=-1)


def test_the_time_aware_prefill_limit_is_on_when_serving_off_offline_and_takes_strings():
    config = EngineConfig()
    assert config.scheduler.max_decode_slowdown == "auto" and config.scheduler.decode_slowdown() == 0
    assert config.for_serving().scheduler.decode_slowdown() == SERVING_MAX_DECODE_SLOWDOWN == 2
    unchunked = EngineConfig.from_flat(enable_chunked_prefill=False)
    assert unchunked.for_serving().scheduler.decode_slowdown() == 0
    for value, number in (("1.5", 1.5), ("0", 0)):  # as from --set or KVSERVE_MAX_DECODE_SLOWDOWN
        chosen = EngineConfig.from_flat(max_decode_slowdown=value)
        assert chosen.scheduler.decode_slowdown() == chosen.for_serving().scheduler.decode_slowdown() == number


def test_a_slowdown_of_one_or_less_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="max_decode_slowdown=0.5: .* must be above 1"):
        EngineConfig.from_flat(max_decode_slowdown=0.5)
    with pytest.raises(ConfigError, match="max_decode_slowdown"):
        EngineConfig.from_flat(max_decode_slowdown=-2)


def test_a_slowdown_without_chunked_prefill_is_refused_naming_both_fields():
    with pytest.raises(ConfigError, match="max_decode_slowdown=2.0 .* needs enable_chunked_prefill"):
        EngineConfig.from_flat(max_decode_slowdown=2, enable_chunked_prefill=False)
