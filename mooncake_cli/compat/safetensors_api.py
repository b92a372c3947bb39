"""The compat store's safetensors files (upstream's save_tensor_to_safetensor and
load_tensor_from_safetensor). They need the
`safetensors` package (the `models` extra); without it they fail as a missing file would."""

from __future__ import annotations

import logging
from typing import Any

from mooncake_cli.compat.tensor_api import Tensors
from mooncake_cli.store.errors import StoreCode

log = logging.getLogger("mooncake.compat")
NOT_FOUND, WRITE_FAIL = int(StoreCode.FILE_NOT_FOUND), int(StoreCode.FILE_WRITE_FAIL)


def _torch_io() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        log.error("safetensors is not installed (pip install 'mooncake-cli[models]')")
        return None
    return safetensors.torch


class SafeTensors:
    """Tensors between safetensors files and the store (`tensors`')."""

    def __init__(self, tensors: Tensors) -> None:
        self._tensors = tensors

    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        """Write the tensor of `key` to the safetensors file `file_name` (default: the key, in the
        working directory) under the name `key`; 0, or -1100 when there is no such tensor."""
        io = _torch_io()
        tensor = self._tensors.get_tensor(key)
        if tensor is None or io is None:
            log.error("save_tensor_to_safetensor: no tensor under %r", key)
            return NOT_FOUND
        try:
            io.save_file({key: tensor.contiguous()}, str(file_name or key))
        except (OSError, ValueError, TypeError) as e:
            log.error("save_tensor_to_safetensor: %s", e)
            return WRITE_FAIL
        return 0

    def load_tensor_from_safetensor(self, key: str | None = None,
                                    file_name: str | None = None) -> Any:
        """Put the tensor named `key` (default: the file name) of the safetensors file into the
        store under that key and return it; the file's first tensor when it has none of that name
        (with a warning); None when the file cannot be read or the put fails."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() missing argument 'file_name'")
        io = _torch_io()
        name = str(file_name if key is None else key)
        try:
            tensors = io.load_file(str(file_name)) if io is not None else {}
        except Exception as e:  # safetensors raises its own errors for a bad file
            log.error("load_tensor_from_safetensor: %s: %s", file_name, e)
            return None
        if not tensors:
            return None
        tensor = tensors.get(name)
        if tensor is None:
            first = next(iter(tensors))
            log.warning("load_tensor_from_safetensor: %s holds no %r: using %r", file_name, name,
                        first)
            tensor = tensors[first]
        return tensor if self._tensors.put_tensor(name, tensor) == 0 else None
