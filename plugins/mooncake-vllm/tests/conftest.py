"""Fixtures: the smollm2-135m HF folder (exported once, cached), a log folder, the two sides
(ours, upstream's wheel) and the greedy texts of a plain vLLM instance (no connector)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prompts import short_prompts
from sides import Side, base_env, upstream_missing
from vllm_server import MAX_TOKENS, VllmServer

MODEL = "smollm2-135m"


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("MOONCAKE_VLLM_MODEL_DIR", Path(root) / "mooncake" / "hf" / MODEL))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """`mooncake models export smollm2-135m --hf DIR`, once: DIR is kept between runs
    (MOONCAKE_VLLM_MODEL_DIR, default ~/.cache/mooncake/hf/smollm2-135m)."""
    final = _cache_dir()
    if (final / "config.json").is_file() and (final / "model.safetensors").is_file():
        return final
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "mooncake_cli", "models", "export", MODEL,
                        "--hf", str(partial)], env=base_env(), capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"mooncake models export failed:\n{p.stdout[-2000:]}"
                           f"{p.stderr[-2000:]}")
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="module", params=["ours", "upstream"])
def side(request: pytest.FixtureRequest, logs: Path) -> Iterator[Side]:
    if request.param == "upstream" and (why := upstream_missing()):
        pytest.skip(why)
    folder = logs / f"{request.module.__name__}-{request.param}"
    folder.mkdir()
    s = Side(request.param, folder)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def plain_texts(model_dir: Path, logs: Path) -> dict[str, str]:
    """The greedy text of each P/D prompt from one vLLM instance without a connector (stopped
    before the P/D pairs start: at most two vLLM processes at once on this host)."""
    server = VllmServer("plain", model_dir, base_env(), logs / "vllm-plain.log")
    try:
        server.wait_ready()
        return {p: server.complete(p, max_tokens=MAX_TOKENS)["choices"][0]["text"]
                for p in short_prompts()}
    finally:
        server.stop()
