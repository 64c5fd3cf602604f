"""SchedulerConfig: the per-request prefill cap and its refusal without chunked prefill."""

from __future__ import annotations

import pytest

from kvserve.config import EngineConfig
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
