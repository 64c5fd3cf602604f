"""kvserve.testing as a pytest plugin: light to load, harmless for test runs that do not use it."""

import subprocess
import sys

pytest_plugins = ["pytester"]


def test_importing_the_test_kit_does_not_import_torch():
    code = (
        "import sys, kvserve.testing, kvserve.testing.pytest_plugin, kvserve.testing.check, kvserve.cli.check; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


def test_plugin_adds_marker_option_and_fixture_without_loading_torch_for_plain_tests(pytester):
    pytester.makepyfile(
        """
        import sys

        def test_plain(request):
            assert "torch" not in sys.modules, "the kvserve pytest plugin must not import torch"
            assert request.config.getoption("kvserve_seeds") == 2

        def test_fixture(paged_sequences):
            assert paged_sequences.__name__ == "PagedSequences"
        """
    )
    result = pytester.runpytest_subprocess("--kvserve-seeds=2", "--strict-markers", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    markers = pytester.runpytest_subprocess("--markers", "-p", "no:cacheprovider")
    markers.stdout.fnmatch_lines(["@pytest.mark.kvserve_contract: *"])
