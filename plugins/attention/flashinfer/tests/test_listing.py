"""``kvserve plugins`` lists the flashinfer backend, saying why it is unavailable when flashinfer is missing."""

import os
import subprocess
import sys

from kvserve_attention_flashinfer.library import missing_reason


def test_kvserve_plugins_lists_it_with_its_status():
    env = os.environ | {"COLUMNS": "300"}
    out = subprocess.run([sys.executable, "-m", "kvserve.cli", "plugins"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if "kvserve-attention-flashinfer" in line)
    assert " flashinfer " in line
    missing = missing_reason()
    if missing is None:
        assert "ok" in line, line
    else:
        assert f"unavailable: {missing}" in line, line
        assert "flashinfer is not installed (pip install kvserve-attention-flashinfer[gpu])" in missing
