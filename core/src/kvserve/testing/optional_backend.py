"""Checks for an attention backend whose kernels come from an optional library, run where the
library may be missing (a machine without the library's device): it is listed with the reason,
refused with it on a platform it does not run on, and forcing it there fails at start with it.
Each check skips, saying why, where the library is present.

A plugin's test subclasses :class:`OptionalLibraryBackendChecks`::

    class TestWithoutMyLibrary(OptionalLibraryBackendChecks):
        backend = "my_backend"
        distribution = "my-kvserve-attention"
        library = MY_LIBRARY
        other_platform = "<a platform installed here that the backend does not run on>"
        model_type = "<a transformers model type an installed model plugin serves>"
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import TYPE_CHECKING, ClassVar

import pytest
import torch

from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
from kvserve.plugins import load_component

if TYPE_CHECKING:
    from pathlib import Path

    from kvserve.optional_library import OptionalLibrary


class OptionalLibraryBackendChecks:
    """The checks; name the backend, its plugin's distribution and its :class:`OptionalLibrary`."""

    backend: ClassVar[str]
    """Registry name of the attention backend."""
    distribution: ClassVar[str]
    """Distribution of the plugin that registers it (how ``kvserve plugins`` names its row)."""
    library: ClassVar[OptionalLibrary]
    """The library the backend's ``required_library`` names."""
    other_platform: ClassVar[str]
    """Registry name of an installed platform whose device the backend does not run on."""
    model_type: ClassVar[str]
    """A transformers model type (``build_tiny_model``) an installed model plugin serves, for the engine check."""

    def missing(self) -> str:
        """The library's missing reason; skips the calling check where the library is usable."""
        reason = self.library.missing_reason()
        if reason is None:
            pytest.skip(f"{self.library.name} is installed here")
        return reason

    def test_kvserve_plugins_lists_it_with_its_status(self):
        env = os.environ | {"COLUMNS": "300"}
        out = subprocess.run([sys.executable, "-m", "kvserve.cli", "plugins"], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        line = next(line for line in out.stdout.splitlines() if self.distribution in line)
        assert f" {self.backend} " in line
        reason = self.library.missing_reason()
        assert ("ok" if reason is None else f"unavailable: {reason}") in line, line

    def test_refusal_names_the_platform_and_the_missing_library(self):
        reason = self.missing()
        backend = load_component("attention_backend", self.backend)
        platform = load_component("platform", self.other_platform)()
        spec = AttentionSpec(
            8, 2, 128, torch.float16, backend.default_block_size, platform.device(), (LayerAttentionSpec(0.1),)
        )
        reasons = backend.unsupported_reasons(spec, platform)
        runs_on = ", ".join(backend.device_types)
        assert f"platform {self.other_platform!r} not supported (runs on: {runs_on})" in reasons
        assert reason in reasons

    def test_forcing_it_on_another_platform_fails_at_start_with_the_reason(self, tmp_path: Path):
        from kvserve import LLM
        from kvserve.errors import ConfigError
        from kvserve.testing.hf_models import build_tiny_model

        reason = self.missing()
        path = build_tiny_model(self.model_type, tmp_path)
        with pytest.raises(ConfigError, match=f"{self.backend}: .*{re.escape(reason)}"):
            LLM(
                str(path),
                platform=self.other_platform,
                attention_backend=self.backend,
                max_model_len=64,
                num_kv_blocks=8,
            )
