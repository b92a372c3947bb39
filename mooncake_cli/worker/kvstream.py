"""KVStream: a reservation on a decode worker and the WRITEs that fill it while prefill runs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from mooncake_cli.interfaces import TransferError
from mooncake_cli.jsonhttp import HTTPError, call
from mooncake_cli.transfer.batch import Batch, Op, State, Status, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

log = logging.getLogger("mooncake.worker")


class KVStream:
    """Reserve blocks for `num_tokens` on the decode worker at `decode_url`, then `send` local
    pool blocks (by their index in the request's block table) into the reserved ones. With
    `num_blocks`, a reservation of any other number of blocks is refused (and released)."""

    def __init__(self, engine: TransferEngine, region: Region, decode_url: str,
                 request_id: str, num_tokens: int, block_bytes: int, max_tokens: int,
                 timeout: float = 30.0, num_blocks: int | None = None) -> None:
        self.engine = engine
        self.region = region
        self.url = decode_url.rstrip("/")
        self.request_id = request_id
        self.block_bytes = block_bytes
        self.timeout = timeout
        self.bytes_sent = 0
        self._batches: list[Batch] = []
        body = {"request_id": request_id, "num_tokens": num_tokens, "max_tokens": max_tokens}
        try:
            answer = call(self.url + "/v1/kv/reserve", body, timeout=timeout)
        except (OSError, ValueError) as e:
            raise HTTPError(502, f"decode worker {self.url} unreachable: {e}",
                            kind="upstream_error", code="decode_unreachable") from None
        if answer.status != 200:
            message = f"decode worker {self.url} refused the KV reservation: " \
                      f"{_message(answer.body)}"
            if answer.status == 413:  # can never fit that worker's cache: retrying is useless
                raise HTTPError(400, message, code="decode_too_large")
            raise HTTPError(503 if answer.status == 503 else 502, message, kind="upstream_error",
                            code="decode_full" if answer.status == 503 else "decode_refused")
        try:
            got: dict[str, Any] = answer.body
            self.segment = got["segment"]
            self.block_ids = [int(b) for b in got["block_ids"]]
            self.base = int(got.get("base", 0))
            their_bytes = int(got["block_bytes"])
            if not isinstance(self.segment, str) or not self.segment or self.base < 0 or \
                    any(b < 0 for b in self.block_ids):
                raise ValueError(f"segment {got['segment']!r}, base {self.base}, "
                                 f"block ids {self.block_ids[:8]}")
        except (KeyError, TypeError, ValueError) as e:
            self.release()
            raise HTTPError(502, f"decode worker {self.url} answered a malformed reservation: "
                                 f"{e}", kind="upstream_error", code="decode_refused") from None
        if their_bytes != block_bytes:
            self.release()
            raise HTTPError(409, f"decode worker {self.url} caches {their_bytes}-byte "
                                 f"blocks, this prefill {block_bytes}: not the same model, "
                                 "dtype or block size", kind="upstream_error")
        if num_blocks is not None and len(self.block_ids) != num_blocks:
            self.release()
            raise HTTPError(502, f"decode worker {self.url} reserved {len(self.block_ids)} "
                                 f"KV blocks for a prompt needing {num_blocks}",
                            kind="upstream_error", code="decode_refused")

    def send(self, pairs: Iterable[tuple[int, int]]) -> None:
        """WRITE each (index in the block table, local pool block) to the reserved block."""
        bb = self.block_bytes
        reqs = [TransferRequest(Op.WRITE, self.region, local * bb, self.segment,
                                self.base + self.block_ids[i] * bb, bb) for i, local in pairs]
        if reqs:
            self._batches.append(self.engine.submit(reqs))
            self.bytes_sent += bb * len(reqs)

    def _settle(self) -> list[Status]:
        """Wait (up to `timeout` in all) for every submitted WRITE; the statuses of those not
        completed (PENDING: still in flight)."""
        deadline = time.monotonic() + self.timeout
        return [st for batch in self._batches
                for st in batch.wait(max(0.0, deadline - time.monotonic()))
                if st.state is not State.COMPLETED]

    def finish(self) -> None:
        """Wait for every WRITE; TransferError naming the first one that failed."""
        failures = self._settle()
        if failures:
            raise TransferError(f"streaming KV to {self.segment} failed: "
                                f"{failures[0].reason or 'timed out'}")
        self._batches.clear()

    def release(self) -> None:
        """Give the reservation back (the request will not be decoded there) — once no WRITE
        is in flight any more: a late one would land in blocks given to the next request. If
        one still is, the reservation is left to expire on the decode worker."""
        if any(st.state is State.PENDING for st in self._settle()):
            log.warning("KV writes of %s to %s still in flight: leaving its reservation to "
                        "expire", self.request_id, self.url)
            return
        self._batches.clear()
        try:
            call(self.url + "/v1/kv/release", {"request_id": self.request_id}, timeout=5.0)
        except (OSError, ValueError) as e:
            log.info("could not release reservation %s on %s: %s", self.request_id, self.url, e)


def _message(body: dict[str, Any]) -> str:
    err = body.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err if err is not None else body)
