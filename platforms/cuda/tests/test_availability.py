"""Without CUDA the platform says why, cheaply; discovery never imports the platform module."""

import subprocess
import sys

import pytest
import torch

from kvserve.plugins import get_plugin_manager, load_component

cuda_here = torch.cuda.is_available()


@pytest.mark.skipif(cuda_here, reason="a CUDA device is visible here: the platform is available")
def test_unavailable_reason_says_why():
    reason = load_component("platform", "cuda").unavailable_reason()
    expected = "torch was built without CUDA" if not torch.backends.cuda.is_built() else "no CUDA device visible"
    assert reason is not None and reason.startswith(expected)


def test_registered_above_the_cpu_platform():
    registration = get_plugin_manager().registry("platform").get("cuda")
    assert registration.package == "kvserve-platform-cuda"
    assert registration.priority > get_plugin_manager().registry("platform").get("cpu").priority


def test_discovery_does_not_import_the_platform_module():
    code = (
        "import sys\n"
        "from kvserve.plugins import get_plugin_manager\n"
        "assert 'cuda' in get_plugin_manager().registry('platform').names()\n"
        "print('kvserve_platform_cuda.platform' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
