"""The CPU workaround: registered as vLLM's general plugin `cpu_accelerator_index`, it makes
`torch.accelerator.current_device_index()` answer 0 where torch has no accelerator (vLLM's
MooncakeConnector calls it), and defers to torch wherever an accelerator exists."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch

from mooncake_vllm.cpu_accelerator_index import patched

CPU_ONLY = not torch.accelerator.is_available()


def _run(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


def test_registered_as_a_vllm_general_plugin() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("cpu_accelerator_index") == "mooncake_vllm.cpu_accelerator_index:install"


@pytest.mark.skipif(not CPU_ONLY, reason="an accelerator exists: torch answers by itself")
def test_vllm_loading_its_plugins_makes_the_call_answer_0() -> None:
    out = _run(
        "import torch\n"
        "try:\n"
        "    torch.accelerator.current_device_index(); print('no error')\n"
        "except RuntimeError as e:\n"
        "    print('before:', e)\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins(); load_general_plugins()\n"
        "print('after:', torch.accelerator.current_device_index())\n"
    )
    assert "Cannot access accelerator device when none is available" in out
    assert out.endswith("after: 0")


def test_defers_to_torch_while_an_accelerator_is_available() -> None:
    state = {"available": True}
    f = patched(lambda: 3, lambda: state["available"])
    assert f() == 3
    state["available"] = False
    assert f() == 0
