"""`mooncake bench profile --url`: one error line when the URL cannot be reached, is not an
OpenAI-compatible server, or comes with our engine's flags (a real vLLM server is profiled in
plugins/mooncake-vllm/tests/test_bench_profile_vllm.py)."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(60)
runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_mooncake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("MOONCAKE_"):
            monkeypatch.delenv(key)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the test reads stderr
        pass


@pytest.fixture
def files_server(tmp_path: Path) -> Iterator[str]:
    """A plain static-file HTTP server on loopback (GET /v1/models: 404)."""
    handler = functools.partial(_Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def profile(url: str, out: Path, *args: str) -> Any:
    return runner.invoke(app, ["bench", "profile", "--url", url, *args, "-o", str(out)],
                         prog_name="mooncake")


def one_error_line(result: Any) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return str(lines[0])


def test_an_unreachable_url_is_one_error_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = profile(url, tmp_path / "p.json")
    assert result.exit_code == 6
    line = one_error_line(result)
    assert f"cannot reach {url}/v1/models" in line and "refused" in line
    assert not (tmp_path / "p.json").exists()


def test_a_server_that_is_not_openai_is_one_error_line(files_server: str, tmp_path: Path) -> None:
    result = profile(files_server, tmp_path / "p.json")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert f"{files_server} is not an OpenAI-compatible server" in line and "HTTP 404" in line
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("args,words", [
    (["--model", "demo"], "--model"),
    (["--threads", "1", "--chunk-size", "64"], "--chunk-size, --threads"),
])
def test_our_engines_flags_are_refused_with_url(args: list[str], words: str,
                                                tmp_path: Path) -> None:
    result = profile("http://127.0.0.1:1", tmp_path / "p.json", *args)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert f"{words}: our engine's, not with --url" in line


def test_a_bad_url_is_one_error_line(tmp_path: Path) -> None:
    result = profile("https://127.0.0.1:1", tmp_path / "p.json")
    assert result.exit_code == 2
    assert "--url: not an http://HOST:PORT URL" in one_error_line(result)
