"""``kvserve serve``/``chat``/``bench`` and the config sources behind ``--config`` and ``KVSERVE_*``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from kvserve.cli import bench, chat, serve  # noqa: F401  (registers the commands)
from kvserve.cli.app import app
from kvserve.config_sources import load_config, parse_assignments
from kvserve.errors import ConfigError


def test_file_then_env_then_command_line(tmp_path: Path) -> None:
    yaml_file = tmp_path / "kvserve.yaml"
    yaml_file.write_text("max_num_seqs: 4\nserver:\n  port: 9001\n  host: 0.0.0.0\nmodel: ./some-model\n")
    config = load_config(yaml_file, {"host": "127.0.0.2"}, environ={"KVSERVE_PORT": "9002", "KVSERVE_LOG_LEVEL": "x"})
    assert (config.scheduler.max_num_seqs, config.server.port, config.server.host) == (4, 9002, "127.0.0.2")
    assert config.model.model == "./some-model"
    toml_file = tmp_path / "kvserve.toml"
    toml_file.write_text(
        '[server]\napi_key = "sk-hidden"\nmax_request_body_bytes = "1MiB"\n[scheduler]\nmax_num_seqs = 2\n'
    )
    config = load_config(toml_file, environ={})
    assert config.server.api_key.get_secret_value() == "sk-hidden" and config.server.max_request_body_bytes == 2**20
    assert "sk-hidden" not in repr(config)  # the key never shows in logs
    assert parse_assignments(["max-num-seqs=3", "dtype=float32"]) == {"max_num_seqs": "3", "dtype": "float32"}


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("bad.yaml", "port: [unclosed", "bad.yaml"),
        ("list.yaml", "- 1\n- 2\n", "expected a mapping"),
        ("unknown.toml", "colour = 'red'\n", "unknown config field 'colour'"),
        ("range.yaml", "port: 70000\n", "server.port"),
        ("config.ini", "port=1\n", "unknown format"),
    ],
)
def test_bad_config_files_name_the_problem(tmp_path: Path, name: str, text: str, match: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path / name, environ={})


def test_bad_env_value_names_the_field() -> None:
    with pytest.raises(ConfigError, match="max_num_seqs"):
        load_config(environ={"KVSERVE_MAX_NUM_SEQS": "many"})
    with pytest.raises(ConfigError, match="--set 'oops'"):
        parse_assignments(["oops"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
        except OSError:
            continue  # it exited meanwhile
    return found


@pytest.mark.parametrize("engine", ["--no-engine-process", "--engine-process"])
def test_serve_cli_applies_config_and_shuts_down_gracefully_on_sigterm(
    tiny_model_dir: Path, tmp_path: Path, engine: str
) -> None:
    port = _free_port()
    config = tmp_path / "serve.yaml"
    config.write_text(f"server:\n  port: {port}\nmax_model_len: 200\n")
    env = {**os.environ, "KVSERVE_SERVED_MODEL_NAME": "tiny-from-env", "KVSERVE_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "kvserve.cli", "serve", str(tiny_model_dir), "--config", str(config), engine]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180  # a hang guard, not a speed check: a loaded machine starts slowly
        while True:
            try:
                models = httpx.get(f"{url}/v1/models").json()["data"]
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert [(m["id"], m["max_model_len"]) for m in models] == [("tiny-from-env", 200)]
        children = _children(process.pid) if sys.platform.startswith("linux") else []
        cores = [pid for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(cores) == (engine == "--engine-process" and sys.platform.startswith("linux")), children

        lines: list[str] = []
        first_chunk = threading.Event()
        body = {"prompt": "Graceful", "max_tokens": 150, "ignore_eos": True, "stream": True}

        def stream() -> None:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
                for line in response.iter_lines():
                    lines.append(line)
                    first_chunk.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first_chunk.wait(30)
        process.send_signal(signal.SIGTERM)  # mid-stream: the request still finishes
        reader.join(60)
        assert process.wait(30) == 0, process.stdout.read()
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health")
        assert not any(Path(f"/proc/{pid}").exists() for pid in cores), "the engine core outlived the server"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_bench_serve_reports_latency_percentiles_and_throughput(server) -> None:
    result = CliRunner().invoke(
        app,
        ["bench", "serve", "--base-url", server.url, "--num-prompts", "6", "--output-len", "5", "--request-rate", "50"],
    )
    assert result.exit_code == 0, result.output
    for needle in ("TTFT (ms)", "TPOT (ms)", "ITL (ms)", "p99", "6 completed, 0 failed", "req/s", "output tok/s"):
        assert needle in result.output


def test_bench_serve_without_a_server_fails_clearly() -> None:
    result = CliRunner().invoke(app, ["bench", "serve", "--base-url", f"http://127.0.0.1:{_free_port()}"])
    assert result.exit_code == 1 and "no request succeeded" in result.output


def test_offline_benches_on_a_tiny_model(tiny_model_dir: Path) -> None:
    model = ["--model", str(tiny_model_dir), "--set", "max_num_seqs=8"]
    throughput = CliRunner().invoke(app, ["bench", "throughput", *model, "--num-prompts", "4", "--output-len", "4"])
    assert throughput.exit_code == 0, throughput.output
    assert "output tokens/s" in throughput.output
    latency = CliRunner().invoke(
        app,
        ["bench", "latency", *model, "--batch-size", "2", "--input-len", "8", "--output-len", "4", "--num-iters", "2"],
    )
    assert latency.exit_code == 0, latency.output
    assert "p99" in latency.output


def test_chat_against_a_server_streams_replies(server, client) -> None:
    expected = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=6, temperature=0
    )
    result = CliRunner().invoke(
        app, ["chat", "--url", f"{server.url}/v1", "--max-tokens", "6", "--temperature", "0"], input="hello\n/exit\n"
    )
    assert result.exit_code == 0, result.output
    assert "Chatting with tiny" in result.output
    # As a terminal shows it: without control characters.
    reply = "".join(char for char in expected.choices[0].message.content if char.isprintable())
    assert reply.strip() in result.output


def test_chat_in_process(tiny_model_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["chat", "--local", "--model", str(tiny_model_dir), "--max-tokens", "4"], input="hi\n/reset\nagain\n"
    )
    assert result.exit_code == 0, result.output
    assert result.output.count(">>> ") == 4  # two replies, then the prompt after /reset and at end of input


def test_structured_outputs_config_is_json_on_the_command_line(monkeypatch):
    started = {}
    monkeypatch.setattr("kvserve.server.runner.serve", lambda config, log_level: started.update(config=config))
    option = '{"backend": "guidance", "disable_any_whitespace": true}'
    result = CliRunner().invoke(app, ["serve", "--structured-outputs-config", option])
    assert result.exit_code == 0, result.output
    chosen = started["config"].decoding.structured_outputs_config
    assert chosen.backend == "guidance" and chosen.disable_any_whitespace and not chosen.disable_fallback
    result = CliRunner().invoke(app, ["serve", "--structured-outputs-config", '{"backnd": "x"}'])
    assert result.exit_code != 0 and "structured_outputs_config.backnd" in str(result.exception)


def test_generation_config_options_reach_the_config(monkeypatch, tmp_path: Path) -> None:
    started = {}
    monkeypatch.setattr("kvserve.server.runner.serve", lambda config, log_level: started.update(config=config))
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.5}')
    options = ["--generation-config", str(tmp_path), "--override-generation-config", '{"top_p": 0.9}']
    result = CliRunner().invoke(app, ["serve", *options])
    assert result.exit_code == 0, result.output
    model = started["config"].model
    assert (model.generation_config, model.override_generation_config) == (str(tmp_path), {"top_p": 0.9})
    result = CliRunner().invoke(app, ["serve", "--generation-config", str(tmp_path / "nowhere")])
    assert result.exit_code != 0 and "model.generation_config" in str(result.exception)
    result = CliRunner().invoke(app, ["serve", "--override-generation-config", '{"temprature": 0.5}'])
    assert result.exit_code != 0 and "unknown keys ['temprature']" in str(result.exception)


def test_speculative_config_is_json_on_the_command_line(monkeypatch):
    started = {}
    monkeypatch.setattr("kvserve.server.runner.serve", lambda config, log_level: started.update(config=config))
    option = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "disable_by_batch_size": 8}'
    result = CliRunner().invoke(app, ["serve", "--speculative-config", option])
    assert result.exit_code == 0, result.output
    chosen = started["config"].decoding.speculative_config
    assert (chosen.method, chosen.num_speculative_tokens, chosen.prompt_lookup_min, chosen.prompt_lookup_max) == (
        "ngram", 3, 4, 4,
    )  # fmt: skip
    result = CliRunner().invoke(app, ["serve", "--speculative-config", '{"method": "ngram", "num_spec_tokens": 3}'])
    assert result.exit_code != 0 and "speculative_config.num_spec_tokens" in str(result.exception)
