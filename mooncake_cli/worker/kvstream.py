"""KVStream: a reservation on a decode worker and the WRITEs that fill it while prefill runs."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from mooncake_cli.interfaces import TransferError
from mooncake_cli.jsonhttp import HTTPError, call
from mooncake_cli.transfer.batch import Batch, Op, State, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

log = logging.getLogger("mooncake.worker")


class KVStream:
    """Reserve blocks for `num_tokens` on the decode worker at `decode_url`, then `send` local
    pool blocks (by their index in the request's block table) into the reserved ones."""

    def __init__(self, engine: TransferEngine, region: Region, decode_url: str,
                 request_id: str, num_tokens: int, block_bytes: int, max_tokens: int,
                 timeout: float = 30.0) -> None:
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
            message = _message(answer.body)
            raise HTTPError(503 if answer.status == 503 else 502,
                            f"decode worker {self.url} refused the KV reservation: {message}",
                            kind="upstream_error",
                            code="decode_full" if answer.status == 503 else "decode_refused")
        got: dict[str, Any] = answer.body
        self.segment = str(got["segment"])
        self.block_ids = [int(b) for b in got["block_ids"]]
        self.base = int(got.get("base", 0))
        if int(got["block_bytes"]) != block_bytes:
            self.release()
            raise HTTPError(409, f"decode worker {self.url} caches {got['block_bytes']}-byte "
                                 f"blocks, this prefill {block_bytes}: not the same model, "
                                 "dtype or block size", kind="upstream_error")

    def send(self, pairs: Iterable[tuple[int, int]]) -> None:
        """WRITE each (index in the block table, local pool block) to the reserved block."""
        bb = self.block_bytes
        reqs = [TransferRequest(Op.WRITE, self.region, local * bb, self.segment,
                                self.base + self.block_ids[i] * bb, bb) for i, local in pairs]
        if reqs:
            self._batches.append(self.engine.submit(reqs))
            self.bytes_sent += bb * len(reqs)

    def finish(self) -> None:
        """Wait for every WRITE; TransferError naming the first one that failed."""
        for batch in self._batches:
            for st in batch.wait(self.timeout):
                if st.state is not State.COMPLETED:
                    raise TransferError(f"streaming KV to {self.segment} failed: "
                                        f"{st.reason or 'timed out'}")
        self._batches.clear()

    def release(self) -> None:
        """Give the reservation back (the request will not be decoded there)."""
        try:
            call(self.url + "/v1/kv/release", {"request_id": self.request_id}, timeout=5.0)
        except OSError as e:
            log.info("could not release reservation %s on %s: %s", self.request_id, self.url, e)


def _message(body: dict[str, Any]) -> str:
    err = body.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err if err is not None else body)
