"""``kvserve plugins`` lists the flash_attn backend, saying why it is unavailable when flash-attn is missing."""

import os
import subprocess
import sys

from kvserve_attention_flash_attn.library import missing_reason


def test_kvserve_plugins_lists_it_with_its_status():
    env = os.environ | {"COLUMNS": "300"}
    out = subprocess.run([sys.executable, "-m", "kvserve.cli", "plugins"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if "kvserve-attention-flash-attn" in line)
    assert " flash_attn " in line
    missing = missing_reason()
    if missing is None:
        assert "ok" in line, line
    else:
        assert f"unavailable: {missing}" in line, line
        assert "flash-attn is not installed (pip install kvserve-attention-flash-attn[gpu])" in missing
