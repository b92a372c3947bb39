"""Write capabilities for KV reservations (the decode side of `transfer.capability`).

The decode worker's KV pool is guarded: its transfer listener takes a WRITE into it only with
the capability of a reservation covering those bytes. `/v1/kv/reserve` answers the capability
(hex, `capability`) with the blocks; the prefill worker's KVStream sends it with every WRITE,
so a prefill pointed at a fake decode URL that names the real worker's blocks is refused.

A capability is revoked when its reservation is released, forgotten or starts generating (the
prefill is done writing by then). A reservation nobody wrote into within UNUSED_TTL seconds is
freed, and one requester (the caller's address) may hold at most MAX_UNUSED_SHARE of the pool
in unused reservations, so reserving everything and never writing cannot starve the worker.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError

if TYPE_CHECKING:
    from mooncake_cli.worker.decode import DecodeWorker

log = logging.getLogger("mooncake.worker")
RESERVATION_TTL = 120.0  # seconds a reservation waits for its /v1/generate before it is freed
UNUSED_TTL = 30.0  # seconds a reservation may wait for its first KV write
MAX_UNUSED_SHARE = 0.5  # of the pool's blocks, in unused reservations of one requester


GrantedReserve = roles.ReserveAnswer  # a reservation with its write capability (hex)


class KVGrants:
    """The capabilities of one decode worker's reservations."""

    def __init__(self, worker: DecodeWorker) -> None:
        self._w = worker

    def sweep(self) -> None:
        """Free the reservations nobody wrote into within UNUSED_TTL seconds."""
        engine = self._w.engine
        if engine is None:
            return
        for rid in engine.grants.expired_unused(UNUSED_TTL):
            engine.grants.revoke(rid)
            log.warning("reservation %s: no KV written within %.0f s, freeing its blocks", rid,
                        UNUSED_TTL)
            self._w.forget(rid)

    def grant(self, answer: roles.ReserveAnswer, request_id: str, holder: str) -> GrantedReserve:
        """`answer` with a capability for its blocks, for `holder`; 429 (and the reservation
        given back) when the holder's unused reservations would pass its share."""
        engine = self._w.engine
        assert engine is not None
        bb = answer.block_bytes
        limit = int(self._w.cache.num_blocks * MAX_UNUSED_SHARE)
        held = sum((g.ends[i] - g.starts[i]) // bb for g in engine.grants.held_by(holder)
                   for i in range(len(g.starts)))
        if held + len(answer.block_ids) > max(limit, 1):
            self._w.forget(request_id)
            raise ServingError(ErrorCode.KV_FULL, f"{holder} already holds {held} KV blocks in "
                               f"reservations it has not written to (at most {limit})",
                               retry_after=1)
        # the capability dies before the decode side could expire the reservation and give its
        # blocks to another request; revocation normally comes much sooner
        token = engine.grants.issue(
            request_id, [(answer.base + b * bb, bb) for b in answer.block_ids],
            RESERVATION_TTL - 1.0, holder)
        return answer.model_copy(update={"capability": token.hex()})

    def revoke(self, request_id: str | None) -> None:
        engine = self._w.engine
        if request_id and engine is not None:
            engine.grants.revoke(request_id)
