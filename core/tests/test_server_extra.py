"""Core imports and runs without the server extra; server features then say what to install."""

import subprocess
import sys

from kvserve.extras import EXTRA_MODULES

BLOCK = f"import sys\nfor name in {sorted(EXTRA_MODULES['server'])!r}:\n    sys.modules[name] = None\n"
"""Makes every import of a server-extra module fail, as if kvserve-core were installed without it."""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120)


def test_core_imports_without_the_server_extra():
    result = run(
        "import kvserve, kvserve.config, kvserve.engine.llm_engine, kvserve.frontend.async_llm, kvserve.testing\n"
        "from kvserve.cli import bench, chat, check, generate, plugins, serve\n"
        "from kvserve.benchmarking import offline, percentile\n"
        "print('imported')\n"
    )
    assert result.returncode == 0 and result.stdout.strip() == "imported", result.stderr


def test_kvserve_serve_says_to_install_the_extra():
    result = run("sys.argv = ['kvserve', 'serve']\nfrom kvserve.cli import main\nmain()\n")
    assert result.returncode == 2, result.stderr
    assert "pip install 'kvserve-core[server]'" in result.stderr and "'fastapi'" in result.stderr
    assert "Traceback" not in result.stderr


def test_importing_the_server_raises_missing_extra_error():
    result = run(
        "from kvserve.errors import MissingExtraError\n"
        "try:\n    import kvserve.server\nexcept MissingExtraError as exc:\n"
        "    assert isinstance(exc, ImportError)\n    print(exc)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the HTTP server (kvserve serve, kvserve.server) needs the 'server' extra")


def test_other_import_errors_pass_through():
    from kvserve.extras import requires_extra

    try:
        with requires_extra("server", "something"):
            import kvserve_no_such_module  # noqa: F401
    except ModuleNotFoundError as exc:
        assert type(exc) is ModuleNotFoundError and exc.name == "kvserve_no_such_module"
    else:
        raise AssertionError("the import should have failed")
