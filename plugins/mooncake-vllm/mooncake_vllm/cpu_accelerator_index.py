"""vLLM 0.32.0's CPU workaround, a `vllm.general_plugins` entry point.

`MooncakeConnectorWorker.__init__` (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/
mooncake_connector.py, near line 1186) calls `torch.accelerator.current_device_index()`, which on
a CPU-only torch raises "Cannot access accelerator device when none is available", so the P/D
connector cannot start on a CPU platform. `install()` makes that call answer 0 (the CPU
platform's only device, what `current_platform.set_device` then receives) while no accelerator
is available, and defers to torch's own function otherwise: on a GPU build it changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

MARK = "_mooncake_vllm_cpu_accelerator_index"


def patched(original: Callable[[], int], available: Callable[[], bool]) -> Callable[[], int]:
    """`original`, except that it answers 0 while `available()` is false."""

    def current_device_index() -> int:
        if available():
            return original()
        return 0

    setattr(current_device_index, MARK, True)
    current_device_index.__doc__ = original.__doc__
    return current_device_index


def install() -> bool:
    """Patch `torch.accelerator.current_device_index` when torch has no accelerator; idempotent
    (vLLM loads general plugins once per process, maybe more). True when the patch is in place."""
    import torch

    acc = torch.accelerator
    if getattr(acc.current_device_index, MARK, False):
        return True
    if acc.is_available():
        return False
    acc.current_device_index = patched(acc.current_device_index, acc.is_available)
    return True
