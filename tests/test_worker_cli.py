"""`mooncake prefill` / `mooncake decode` refuse bad settings with exit code 2 and a message
saying what to do, before loading anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app

runner = CliRunner()


@pytest.mark.parametrize("role,args,message", [
    ("prefill", ["--listen", "nowhere"], "use HOST:PORT"),
    ("decode", ["--listen", "127.0.0.1:99999"], "use HOST:PORT"),
    ("prefill", ["--block-size", "0"], "block_size must be >= 1"),
    ("decode", ["--kv-blocks", "0"], "kv_blocks must be >= 1"),
    ("prefill", ["--conductor", "localhost:9000"], "use http://HOST:PORT"),
    ("decode", ["--heartbeat", "0"], "heartbeat must be > 0"),
    ("prefill", ["--model", "/nonexistent/model"], "no such directory"),
    ("decode", ["--dtype", "int8"], "use one of"),
])
def test_bad_settings_exit_2(role: str, args: list[str], message: str) -> None:
    result = runner.invoke(app, [role, *args], env={"MOONCAKE_SECRET": ""},
                           prog_name="mooncake")
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
