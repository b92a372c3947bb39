"""Facts about this host that peers compare to decide whether they share memory."""

from __future__ import annotations

import socket


def boot_id() -> str:
    """The kernel's boot id: equal for two processes exactly when they share a running host."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def hostname() -> str:
    return socket.gethostname()
