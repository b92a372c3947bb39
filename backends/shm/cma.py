"""Cross-memory attach: the shm transport's copy into and out of a same-host peer's *private*
memory (a registered numpy array, a vLLM KV cache: anything that is not a memfd, so nothing to
map), by `process_vm_writev` / `process_vm_readv`: one kernel copy, no socket, as UCX's cma.

The peer publishes each such region's virtual address (`shm.va`) and shares an alive page for
it over its authenticated lane (`shm.cma` names it), cleared when it unregisters the region, so
a copy never lands in memory the peer has freed. The peer process is held by a pidfd: a copy is
never made once it has exited (its pid could name another process by then). The kernel allows
these calls only where ptrace would be allowed (same user and Yama's ptrace_scope 0, or root);
`CmaRefused` then tells the channel to use its TCP fallback.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
from typing import Any

import numpy as np

from mooncake_cli.transfer.spi import TransferError

_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_writev.restype = _libc.process_vm_readv.restype = ctypes.c_ssize_t
MAX_IOV = 1024  # the kernel's IOV_MAX


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class CmaRefused(TransferError):
    """The kernel does not let this process copy into the peer (ptrace rules)."""


def address(view: memoryview) -> int:
    """The virtual address of a contiguous view's first byte (read-only views too)."""
    return int(np.frombuffer(view, np.uint8).ctypes.data) if len(view) else 0


class Cma:
    """Copies between this process and process `pid`, while it lives."""

    def __init__(self, pid: int, name: str) -> None:
        self.pid, self.name = pid, name
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError as e:
            raise TransferError(f"peer '{name}' (pid {pid}) is gone: {e}") from None
        self._poll = select.poll()
        self._poll.register(self._pidfd, select.POLLIN)

    def _check(self) -> None:
        if self._poll.poll(0):  # a pidfd turns readable when its process exits
            raise TransferError(f"peer '{self.name}' (pid {self.pid}) is gone")

    def write(self, remote: int, src: memoryview) -> None:
        self._copy(_libc.process_vm_writev, remote, src)

    def read(self, remote: int, dst: memoryview) -> None:
        self._copy(_libc.process_vm_readv, remote, dst)

    def _copy(self, call: Any, remote: int, local: memoryview) -> None:
        n = len(local)
        if n == 0:
            return
        self._check()
        base, done = address(local), 0
        while done < n:  # the kernel may copy less than asked; go on from there
            lv = IoVec(base + done, n - done)
            rv = IoVec(remote + done, n - done)
            got = call(self.pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)
            if got <= 0:
                err = ctypes.get_errno()
                if err in (errno.EPERM, errno.EACCES):
                    raise CmaRefused(f"the kernel refuses cross-memory copies into pid "
                                     f"{self.pid} ({os.strerror(err)})")
                if got == 0 or err == errno.ESRCH:
                    raise TransferError(f"peer '{self.name}' (pid {self.pid}) is gone")
                raise TransferError(f"cross-memory copy with '{self.name}' failed: "
                                    f"{os.strerror(err)}")
            done += got

    def close(self) -> None:
        os.close(self._pidfd)
