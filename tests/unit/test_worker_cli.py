"""`mooncake prefill` / `mooncake decode` refuse bad settings with exit code 2 and a message
saying what to do, before loading anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.config.worker import WorkerConfig

runner = CliRunner()


@pytest.mark.parametrize("role,args,message", [
    ("prefill", ["--listen", "nowhere"], "use HOST:PORT"),
    ("decode", ["--listen", "127.0.0.1:99999"], "use HOST:PORT"),
    ("prefill", ["--block-size", "0"], "block_size must be >= 1"),
    ("decode", ["--kv-blocks", "0"], "kv_blocks must be >= 1"),
    ("prefill", ["--conductor", "localhost:9000"], "use http://HOST:PORT"),
    ("decode", ["--heartbeat", "0"], "heartbeat must be > 0"),
    ("prefill", ["--model", "/nonexistent/model"], "no such file or directory"),
    ("decode", ["--dtype", "int8"], "use one of"),
    ("decode", ["--threads", "-1"], "threads must be >= 0"),
])
def test_bad_settings_exit_2(role: str, args: list[str], message: str) -> None:
    result = runner.invoke(app, [role, *args], env={"MOONCAKE_SECRET": ""},
                           prog_name="mooncake")
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_advertised_host_names_the_worker() -> None:
    from mooncake_cli.worker.prefill import PrefillWorker

    with PrefillWorker(WorkerConfig(role="prefill", advertise="node-7", kv_blocks=8)) as w:
        port = w.http.port
        assert w.url == f"http://node-7:{port}" and w.name == f"prefill@node-7:{port}"
        assert w.registration()["url"] == w.url
        assert w.engine is not None and w.engine.address.startswith("node-7:")
