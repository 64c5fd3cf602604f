"""How the engine-building commands combine config sources: defaults < ``--config`` file < ``KVSERVE_*``
environment < ``--set`` < named options (docs/configuration.md states this order)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.cli.options import resolve_config
from kvserve.config import FLAT_FIELDS
from kvserve.config_sources import ENV_PREFIX


@pytest.fixture(autouse=True)
def no_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FLAT_FIELDS:
        monkeypatch.delenv(ENV_PREFIX + name.upper(), raising=False)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "kvserve.yaml"
    path.write_text("scheduler:\n  max_num_seqs: 2\n  max_num_batched_tokens: 512\nport: 9001\nseed: 1\n")
    return path


def test_each_source_overrides_the_ones_before_it(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSERVE_PORT", "9002")
    monkeypatch.setenv("KVSERVE_MAX_NUM_SEQS", "3")
    monkeypatch.setenv("KVSERVE_SEED", "2")
    config = resolve_config(config_file, ["max_num_seqs=4", "seed=3"], seed=4)
    assert config.scheduler.max_num_batched_tokens == 512  # file over the default
    assert config.server.port == 9002  # environment over the file
    assert config.scheduler.max_num_seqs == 4  # --set over the environment
    assert config.model.seed == 4  # a named option over --set
    assert config.scheduler.enable_chunked_prefill is True  # set nowhere: the default


def test_a_named_option_left_out_does_not_hide_a_set_of_its_field() -> None:
    # `kvserve serve -o max_num_seqs=8` passes max_num_seqs=None for the --max-num-seqs it was not given.
    assert resolve_config(None, ["max_num_seqs=8"], max_num_seqs=None).scheduler.max_num_seqs == 8
