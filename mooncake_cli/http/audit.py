"""The audit log (`--audit-log FILE`): one JSON line per access that matters.

    log = AuditLog.open("audit.jsonl", "conductor")     # None for no file
    log.record("register", peer="127.0.0.1:5123", status=200, name="prefill-0")

Every line has `ts` (Unix seconds, when the line is written: the end of the request), `role`
and `event`; the HTTP edge adds `method`, `path`,
`peer`, `status`, `duration_s`, `bytes_in` and `bytes_out`, and the route what it knows
(request id, worker name, KV blocks and bytes). Refused accesses are `event: "refused"`.
Each line is one append (O_APPEND), so the roles of a `--local` cluster share one file. Roles
that finish together may append in either order: `ts - duration_s` (when each request began)
orders one request's lines causally.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from mooncake_cli.interfaces import ConfigError


class AuditLog:
    """Appends JSON lines to one file; safe to share between threads and processes."""

    def __init__(self, path: str, role: str) -> None:
        self.path, self.role = path, role
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as e:
            raise ConfigError(f"--audit-log {path}: cannot open it: {e.strerror}") from None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str, role: str) -> AuditLog | None:
        return cls(path, role) if path else None

    def record(self, event: str, **fields: Any) -> None:
        head = {"ts": round(time.time(), 6), "role": self.role, "event": event}
        line = json.dumps({**head, **{k: v for k, v in fields.items() if k not in head}},
                          default=str, ensure_ascii=True) + "\n"
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, line.encode())

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
