"""Plugins as a third party ships them: a real package, installed, found through its entry point."""

import json
import subprocess
import sys
import textwrap
import types

import pytest

import kvserve
from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError, PluginError
from kvserve.plugins import PluginManager, get_plugin_manager
from kvserve.testing.hf_models import build_tiny_model


def _write_package(root, name, plugin_body, extra_files=None):
    src = root / name
    (src / name).mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name.replace("_", "-")}"
        version = "1.2.3"
        [project.entry-points.kvserve]
        {name} = "{name}.plugin"
        [tool.setuptools]
        packages = ["{name}"]
    """)
    )
    (src / name / "__init__.py").write_text("")
    (src / name / "plugin.py").write_text(textwrap.dedent(plugin_body))
    for filename, body in (extra_files or {}).items():
        (src / name / filename).write_text(textwrap.dedent(body))
    return src


@pytest.fixture(scope="module")
def third_party_site(tmp_path_factory):
    """Installs two throwaway plugin packages into a temp site dir with pip."""
    root = tmp_path_factory.mktemp("pkgs")
    good = _write_package(
        root,
        "acme_models",
        """
        from kvserve import hookimpl

        @hookimpl
        def register_models(register):
            register("AcmeLlamaForCausalLM", "acme_models.model:AcmeLlama")
    """,
        {
            "model.py": """
        from kvserve_models_llama.model import LlamaForCausalLM

        class AcmeLlama(LlamaForCausalLM):
            instances = 0

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                AcmeLlama.instances += 1
    """
        },
    )
    broken = _write_package(
        root,
        "broken_backend",
        """
        import this_dependency_does_not_exist  # noqa: F401
    """,
    )
    raising = _write_package(
        root,
        "raising_hook",
        """
        from kvserve import hookimpl

        @hookimpl
        def register_schedulers(register):
            register("halfway", "raising_hook.nowhere:Scheduler")
            raise RuntimeError("registration exploded")
    """,
    )
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(good),
            str(broken),
            str(raising),
        ],
        check=True,
    )
    return site


@pytest.fixture
def fresh_plugins(monkeypatch):
    """Rediscover plugins for this test, and again afterwards for the rest of the session."""
    get_plugin_manager.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_plugin_manager.cache_clear()


def test_third_party_model_is_registered_and_used_while_a_broken_plugin_is_reported(
    third_party_site, fresh_plugins, tmp_path
):
    fresh_plugins.syspath_prepend(str(third_party_site))
    path = build_tiny_model("llama", tmp_path / "acme")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["AcmeLlamaForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))

    manager = get_plugin_manager()
    registration = manager.registry("model").get("AcmeLlamaForCausalLM")
    assert (registration.package, registration.version) == ("acme-models", "1.2.3")
    broken = manager.plugins["broken_backend"]
    assert broken.package == "broken-backend" and "this_dependency_does_not_exist" in broken.status
    raising = manager.plugins["raising_hook"]  # imported fine, then its hook raised: failed, and nothing of it kept
    assert raising.package == "raising-hook" and raising.status.startswith("failed: register_schedulers raised")
    assert "registration exploded" in raising.status
    assert "halfway" not in manager.registry("scheduler").names()
    assert {"fifo", "priority"} <= set(manager.registry("scheduler").names())

    llm = LLM(str(path), max_model_len=64, num_kv_blocks=16)
    from acme_models.model import AcmeLlama

    assert type(llm.engine.model) is AcmeLlama and AcmeLlama.instances == 1
    out = llm.generate("Paris is", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4

    with pytest.raises(PluginError, match="broken_backend.*broken-backend.*this_dependency_does_not_exist"):
        LLM(str(path), attention_backend="nope", max_model_len=64, num_kv_blocks=16)
    with pytest.raises(PluginError, match="unknown scheduler 'halfway'.*raising-hook.*registration exploded"):
        LLM(str(path), scheduler="halfway", max_model_len=64, num_kv_blocks=16)


def test_cli_lists_plugins_with_package_and_status(third_party_site):
    env = {"PYTHONPATH": str(third_party_site), "COLUMNS": "250", "PATH": ""}
    out = subprocess.run([sys.executable, "-m", "kvserve.cli", "plugins"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "acme-models" in out.stdout and "AcmeLlamaForCausalLM" in out.stdout
    assert "kvserve-attention-cpu" in out.stdout and "broken-backend" in out.stdout
    assert "raising-hook" in out.stdout and "failed" in out.stdout


def test_disabled_kind_says_what_to_install(fresh_plugins, tmp_path):
    fresh_plugins.setenv("KVSERVE_DISABLE_PLUGINS", "kvserve-scheduler-fifo,kvserve-scheduler-priority")
    path = build_tiny_model("llama", tmp_path / "m")
    with pytest.raises(PluginError, match="no scheduler plugin installed: pip install kvserve-scheduler-fifo"):
        LLM(str(path), max_model_len=64, num_kv_blocks=16)


def test_allowlist_keeps_only_named_plugins(fresh_plugins):
    fresh_plugins.setenv("KVSERVE_PLUGINS", "cpu_platform,kvserve-scheduler-fifo")
    manager = get_plugin_manager()
    assert manager.registry("platform").names() == ["cpu"]
    assert manager.registry("attention_backend").names() == []
    assert manager.plugins["cpu_attention"].status == "disabled"
    assert manager.registry("kv_cache_manager").names() == ["paged"]  # core's built-ins always load


def _module(name, hook_body):
    module = types.ModuleType(name)
    exec(textwrap.dedent(hook_body), module.__dict__)
    return module


def test_duplicate_names_name_both_packages_and_version_mismatch_names_the_package():
    manager = PluginManager()
    body = """
        from kvserve import hookimpl
        @hookimpl
        def register_schedulers(register):
            register("lifo", "x:Y", api_version={version})
    """
    manager.add_plugin(_module("a", body.format(version=1)), "a", "pkg-a", "1.0")
    manager.add_plugin(_module("b", body.format(version=1)), "b", "pkg-b", "2.0")
    with pytest.raises(PluginError, match="registered twice: by package pkg-a .* by package pkg-b"):
        manager.registry("scheduler").load("lifo")

    manager.add_plugin(_module("c", body.replace("lifo", "future").format(version=99)), "c", "pkg-c", "3.0")
    with pytest.raises(PluginError, match=r"pkg-c.*written for plugin API version 99.*implements version 1"):
        manager.registry("scheduler").load("future")
    with pytest.raises(PluginError, match="unknown scheduler 'fifo2'; available: future, lifo"):
        manager.registry("scheduler").load("fifo2")


def test_install_hints_come_from_package_metadata_and_the_naming_convention(monkeypatch):
    """Core names no plugin package: what to install comes from the installed distributions' metadata and
    the kvserve-<family>-<name> convention of kvserve's plugin distributions."""
    manager = PluginManager()  # nothing discovered: every installed plugin distribution is "not loaded"
    with pytest.raises(
        PluginError,
        match=r"no quantization method plugin installed: pip install kvserve-quant-awq "
        r"\(installed here but not loaded: kvserve-quant-awq, kvserve-quant-fp8, kvserve-quant-gguf\)",
    ):
        manager.registry("quantization_method").load("awq")
    body = """
        from kvserve import hookimpl
        @hookimpl
        def register_attention_backends(register):
            register("mine", "x:Y")
        @hookimpl
        def register_models(register):
            register("MineForCausalLM", "x:Y")
    """
    manager.add_plugin(_module("mine", body), "mine", "pkg-mine", "1.0")
    with pytest.raises(
        PluginError,
        match="unknown attention backend 'flash_attn'; available: mine; "
        "if 'flash_attn' is one of kvserve's plugins: pip install kvserve-attention-flash-attn$",
    ):
        manager.registry("attention_backend").load("flash_attn")
    with pytest.raises(
        PluginError,
        match=r"unknown model 'GPT2LMHeadModel'; available: MineForCausalLM; install the model plugin that "
        r"implements it \(kvserve's are named kvserve-models-<model family>\)",
    ):
        manager.registry("model").load("GPT2LMHeadModel")
    # Core's built-in kinds name no package.
    with pytest.raises(PluginError, match="no reasoning parser plugin installed$"):
        manager.registry("reasoning_parser").load("nope")
    # An environment with no platform distribution at all: the convention and the default set.
    monkeypatch.setattr("kvserve.registry.plugin_distributions", lambda: [])
    with pytest.raises(
        PluginError,
        match=r"no platform plugin installed: install a kvserve-platform-<name> plugin "
        r"\(pip install kvserve: core with the default plugins\)",
    ):
        manager.registry("platform").load("cpu")


def test_importing_kvserve_and_discovering_plugins_does_not_import_torch():
    code = (
        "import sys, kvserve; from kvserve.plugins import get_plugin_manager; get_plugin_manager(); "
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_bad_config_value_names_the_field():
    with pytest.raises(ConfigError, match=r"scheduler.max_num_seqs: Input should be greater than 0"):
        kvserve.LLM(max_num_seqs=0)
    with pytest.raises(ConfigError, match="unknown config field 'max_num_seq'"):
        kvserve.LLM(max_num_seq=4)
