"""The `vllm` engine of `mooncake prefill` / `mooncake decode` (the `mooncake.engines` entry
point): the worker classes, found without importing vLLM, so that a missing vLLM is one line
naming what to install rather than an ImportError from deep inside."""

from __future__ import annotations

import importlib.util
import sys

from mooncake_cli.interfaces import PluginError
from mooncake_cli.worker.engines import INSTALL, Worker


def worker_class(role: str) -> type[Worker]:
    if importlib.util.find_spec("vllm") is None:
        _, how = INSTALL["vllm"]
        raise PluginError(f"--engine vllm needs vLLM, which {sys.executable} does not have "
                          f"(the mooncake-vllm plugin is there): {how}")
    if role == "prefill":
        from mooncake_vllm.prefill import VllmPrefill

        return VllmPrefill
    from mooncake_vllm.decode import VllmDecode

    return VllmDecode
