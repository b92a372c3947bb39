"""Admission: every request holding or about to hold KV blocks has a budget — the most blocks it
can ever hold — and the budgets never sum past the cache, so a running request always finds
the blocks it grows into."""

from __future__ import annotations

import threading


class Admission:
    def __init__(self, total: int) -> None:
        self.total = total
        self._budgets: dict[str, int] = {}
        self._lock = threading.Lock()

    def committed(self) -> int:
        with self._lock:
            return sum(self._budgets.values())

    def __contains__(self, rid: str) -> bool:
        with self._lock:
            return rid in self._budgets

    def set(self, rid: str, blocks: int) -> bool:
        """Set `rid`'s budget to `blocks` if the total still fits; whether it did."""
        with self._lock:
            others = sum(self._budgets.values()) - self._budgets.get(rid, 0)
            if others + blocks > self.total:
                return False
            self._budgets[rid] = blocks
            return True

    def remove(self, rid: str) -> None:
        with self._lock:
            self._budgets.pop(rid, None)
