"""KVStream: a reservation on a decode worker and the WRITEs that fill it while prefill runs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError, peer_code
from mooncake_cli.api.schema import validate
from mooncake_cli.http.auth import Signer
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.transfer.batch import Batch, Op, State, Status, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region
from mooncake_cli.worker.kvgrant import GrantedReserve
from mooncake_cli.worker.kvwire import KVWire

log = logging.getLogger("mooncake.worker")


class KVStream:
    """Reserve blocks for `num_tokens` on the decode worker at `decode_url`, then `send` local
    pool blocks (by their index in the request's block table) into the reserved ones. With
    `num_blocks`, a reservation of any other number of blocks is refused (and released).
    With an int8 `wire`, each block goes as its int8 object, into the reserved block's first
    bytes (the decode worker must be on the same wire)."""

    def __init__(self, engine: TransferEngine, region: Region, decode_url: str,
                 request_id: str, num_tokens: int, block_bytes: int, max_tokens: int,
                 timeout: float = 30.0, num_blocks: int | None = None,
                 auth: Signer | None = None, wire: KVWire | None = None) -> None:
        self.engine = engine
        self.wire = wire if wire is not None and wire.int8 else None
        self.auth = auth  # signs the reserve and release requests with the cluster secret
        self.region = region
        self.url = decode_url.rstrip("/")
        self.request_id = request_id
        self.block_bytes = block_bytes
        self.timeout = timeout
        self.bytes_sent = 0
        self._batches: list[Batch] = []
        body = roles.ReserveRequest(request_id=request_id, num_tokens=num_tokens,
                                    max_tokens=max_tokens).model_dump()
        try:
            answer = call(self.url + "/v1/kv/reserve", body, timeout=timeout, auth=auth)
        except (OSError, ValueError) as e:
            raise ServingError(ErrorCode.DECODE_UNREACHABLE,
                               f"decode worker {self.url} unreachable: {e}") from None
        if answer.status != 200:
            message, code = peer_code(answer.body)
            message = f"decode worker {self.url} refused the KV reservation: {message}"
            if code is ErrorCode.DECODE_TOO_LARGE:  # never fits that worker: retrying is useless
                raise ServingError(code, message)
            if code is ErrorCode.UNAVAILABLE:  # shutting down: as good as gone
                raise ServingError(ErrorCode.DECODE_UNREACHABLE, message)
            raise ServingError(ErrorCode.DECODE_FULL if code is ErrorCode.KV_FULL
                               else ErrorCode.DECODE_REFUSED, message, retry_after=1
                               if code is ErrorCode.KV_FULL else None)
        try:
            got = validate(GrantedReserve, answer.body)
        except ServingError as e:
            self.release()
            raise self._refused(f"answered a malformed reservation: {e}") from None
        self.segment, self.block_ids, self.base = got.segment, list(got.block_ids), got.base
        try:  # the write capability the decode side checks on every WRITE ("" from old ones)
            self.capability = bytes.fromhex(got.capability) if got.capability else None
        except ValueError:
            self.release()
            raise self._refused("answered a malformed write capability") from None
        if got.block_bytes != block_bytes:
            self.release()
            raise ServingError(ErrorCode.BLOCK_MISMATCH, f"decode worker {self.url} caches "
                               f"{got.block_bytes}-byte blocks, this prefill {block_bytes}: "
                               "not the same model, dtype or block size")
        mine = self.wire.name if self.wire is not None else "native"
        if got.kv_wire != mine:
            self.release()
            raise ServingError(ErrorCode.BLOCK_MISMATCH, f"decode worker {self.url} takes "
                               f"KV as {got.kv_wire}, this prefill sends {mine} (--kv-wire)")
        if num_blocks is not None and len(self.block_ids) != num_blocks:
            self.release()
            raise self._refused(f"reserved {len(self.block_ids)} KV blocks for a prompt "
                                f"needing {num_blocks}")

    def _refused(self, why: str) -> ServingError:
        return ServingError(ErrorCode.DECODE_REFUSED, f"decode worker {self.url} {why}")

    def send(self, pairs: Iterable[tuple[int, int]]) -> None:
        """WRITE each (index in the block table, local pool block) to the reserved block."""
        bb, pairs = self.block_bytes, list(pairs)
        region, size = self.region, bb
        if self.wire is not None:  # the int8 objects of the blocks, from the staging area
            self.wire.stage([local for _, local in pairs])
            assert self.wire.region is not None
            region, size = self.wire.region, self.wire.object_bytes
        reqs = [TransferRequest(Op.WRITE, region, local * size, self.segment,
                                self.base + self.block_ids[i] * bb, size, self.capability)
                for i, local in pairs]
        if reqs:
            self._batches.append(self.engine.submit(reqs))
            self.bytes_sent += size * len(reqs)

    def _settle(self) -> list[Status]:
        """Wait (up to `timeout` in all) for every submitted WRITE; the statuses of those not
        completed (PENDING: still in flight)."""
        deadline = time.monotonic() + self.timeout
        return [st for batch in self._batches
                for st in batch.wait(max(0.0, deadline - time.monotonic()))
                if st.state is not State.COMPLETED]

    def finish(self) -> None:
        """Wait for every WRITE; DECODE_UNREACHABLE naming the first one that failed (the
        conductor then places the request again, with another decode worker if this one is
        gone)."""
        failures = self._settle()
        if failures:
            raise ServingError(ErrorCode.DECODE_UNREACHABLE, f"streaming KV to {self.segment} "
                               f"failed: {failures[0].reason or 'timed out'}")
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
            call(self.url + "/v1/kv/release",
                 roles.ReleaseRequest(request_id=self.request_id).model_dump(), timeout=5.0,
                 auth=self.auth)
        except (OSError, ValueError) as e:
            log.info("could not release reservation %s on %s: %s", self.request_id, self.url, e)

