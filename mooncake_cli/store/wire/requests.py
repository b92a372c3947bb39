"""The requests of the master's wire protocol: one msgspec Struct per operation, tagged by its
`op` field ("put_start", "exists" ...), each knowing how to run itself against a StoreMaster
(`call`), and the bounds every field is decoded under. The codec and the replies are in
`protocol.py`, which re-exports these names.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec

from mooncake_cli.store.errors import InvalidParams
from mooncake_cli.store.ha.leader import LeaderInfo
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.moves import MoveOrders, MoveResult
from mooncake_cli.store.records import (
    MAX_KEY_BYTES,
    MAX_OBJECT_SIZE,
    Mount,
    ObjectMeta,
    Replica,
    ReplicateConfig,
    StoreStats,
    Tier,
)
from mooncake_cli.store.reports import Held, HoldingsReport

MAX_BATCH = 16384  # keys in one batch request
MAX_MESSAGE = 256 << 20  # bytes of one request; the socket drops larger ones

Key = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KEY_BYTES)]
Prefix = Annotated[str, msgspec.Meta(max_length=MAX_KEY_BYTES)]
Size = Annotated[int, msgspec.Meta(ge=1, le=MAX_OBJECT_SIZE)]
Keys = Annotated[list[Key], msgspec.Meta(max_length=MAX_BATCH)]
Checksum = Annotated[str, msgspec.Meta(max_length=128)]


class _Req(msgspec.Struct, tag_field="op", forbid_unknown_fields=True):
    def call(self, m: StoreMaster) -> Any:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError


class _KeyReq(_Req):
    key: Key


class _KeysReq(_Req):
    keys: Keys


class MountSegment(_Req, tag="mount_segment"):
    """`ledger_next`: the first seq of the segment's put ledger (store/ledger.py)."""

    segment: Mount
    ledger_next: Annotated[int, msgspec.Meta(ge=1, lt=1 << 62)] = 1

    def call(self, m: StoreMaster) -> bool:
        return m.mount_segment(self.segment)


class UnmountSegment(_Req, tag="unmount_segment"):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    base: Annotated[int, msgspec.Meta(ge=0)] | None = None

    def call(self, m: StoreMaster) -> tuple[str, ...]:
        return m.unmount_segment(self.name, self.base)


class Heartbeat(_Req, tag="heartbeat"):
    client_id: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]

    def call(self, m: StoreMaster) -> bool:
        return m.heartbeat(self.client_id)


class PutStart(_Req, tag="put_start"):
    """`checksum`: the value's, when the writer has it already; an HA leader then tells the
    replicas' owners at once (store/ha/acks.py). `notes`: the writer leaves a ledger record of
    each replica the answer gives a slot to (store/ledger.py)."""

    key: Key
    size: Size
    config: ReplicateConfig | None = None
    tier: Tier = "dram"
    upsert: bool = False
    checksum: Checksum | None = None
    notes: bool = False

    def call(self, m: StoreMaster) -> tuple[Replica, ...]:
        return m.put_start(self.key, self.size, self.config, tier=self.tier, upsert=self.upsert)


class PutEnd(_Req, tag="put_end"):
    key: Key
    checksum: Checksum | None = None

    def call(self, m: StoreMaster) -> None:
        m.put_end(self.key, self.checksum)


class PutRevoke(_KeyReq, tag="put_revoke"):
    def call(self, m: StoreMaster) -> None:
        m.put_revoke(self.key)


class GetReplicaList(_KeyReq, tag="get_replica_list"):
    def call(self, m: StoreMaster) -> tuple[Replica, ...]:
        return m.get_replica_list(self.key)


class Exists(_KeyReq, tag="exists"):
    def call(self, m: StoreMaster) -> bool:
        return m.exists(self.key)


class Describe(_KeyReq, tag="describe"):
    def call(self, m: StoreMaster) -> ObjectMeta:
        return m.describe(self.key)


class Remove(_Req, tag="remove"):
    key: Key
    force: bool = False
    own: Annotated[str, msgspec.Meta(max_length=1024)] = ""  # the remover's segment: it
    # forgets its replica there itself

    def call(self, m: StoreMaster) -> None:
        m.remove(self.key, self.force, self.own)


class RemoveAll(_Req, tag="remove_all"):
    force: bool = False
    own: Annotated[str, msgspec.Meta(max_length=1024)] = ""  # with force: as Remove's

    def call(self, m: StoreMaster) -> int:
        return m.remove_all(self.force, self.own)


class List(_Req, tag="list"):
    prefix: Prefix = ""

    def call(self, m: StoreMaster) -> list[str]:
        return m.list(self.prefix)


class Stats(_Req, tag="stats"):
    def call(self, m: StoreMaster) -> StoreStats:
        return m.stats()


class GetFsdir(_Req, tag="get_fsdir"):
    """The directory clients of the upstream API persist objects to ("" for none)."""

    def call(self, m: StoreMaster) -> str:
        return m.state.fs_dir


class RegisterExisting(_Req, tag="register_existing"):
    key: Key
    replicas: Annotated[list[Replica], msgspec.Meta(min_length=1, max_length=64)]
    config: ReplicateConfig | None = None

    def call(self, m: StoreMaster) -> ObjectMeta:
        return m.register_existing(self.key, self.replicas, self.config)


class BatchPutStart(_Req, tag="batch_put_start"):
    """`runs`: the client takes a `Run` for an answer where one describes it."""

    keys: Keys
    sizes: Annotated[list[Size], msgspec.Meta(max_length=MAX_BATCH)]
    config: ReplicateConfig | None = None
    tier: Tier = "dram"
    upsert: bool = False
    checksums: Annotated[list[Checksum], msgspec.Meta(max_length=MAX_BATCH)] | None = None
    notes: bool = False
    runs: bool = False

    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_put_start(self.keys, self.sizes, self.config, tier=self.tier,
                                 upsert=self.upsert)


class BatchReplicaClear(_Req, tag="batch_replica_clear"):
    keys: Keys
    segment: Annotated[str, msgspec.Meta(max_length=1024)] = ""

    def call(self, m: StoreMaster) -> list[str]:
        return m.batch_replica_clear(self.keys, self.segment)


class BatchPutEnd(_Req, tag="batch_put_end"):
    """`own`: the writer's transfer segment; it records the replicas there in its holdings
    itself, so its journal need not report them back (reports.py)."""

    keys: Keys
    checksums: Annotated[list[Checksum | None], msgspec.Meta(max_length=MAX_BATCH)] | None = None
    own: Annotated[str, msgspec.Meta(max_length=1024)] = ""

    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_put_end(self.keys, self.checksums, self.own)


class BatchPutRevoke(_KeysReq, tag="batch_put_revoke"):
    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_put_revoke(self.keys)


class BatchGetReplicaList(_KeysReq, tag="batch_get_replica_list"):
    """`runs`: the client takes a `Found` for an answer where one describes it."""

    runs: bool = False

    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_get_replica_list(self.keys)


class BatchExists(_KeysReq, tag="batch_exists"):
    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_exists(self.keys)


class BatchDescribe(_KeysReq, tag="batch_describe"):
    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_describe(self.keys)


class BatchRemove(_Req, tag="batch_remove"):
    keys: Keys
    force: bool = False

    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_remove(self.keys, self.force)


class WhoLeads(_Req, tag="who_leads"):
    """Answered by the service, not the master (LeaderInfo); a standby answers it too."""

    def call(self, m: StoreMaster) -> LeaderInfo:
        raise InvalidParams("who_leads is answered by the master's service")


class PollMoves(_Req, tag="poll_moves"):
    """A client with an SSD segment asks which tier moves to make (see store/offload.py)."""

    client_id: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    ack: Annotated[int, msgspec.Meta(ge=0)] = 0  # MoveOrders.ack of the forgets dropped

    def call(self, m: StoreMaster) -> MoveOrders:
        return m.poll_moves(self.client_id, self.ack)


class MovesDone(_Req, tag="moves_done"):
    client_id: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    results: Annotated[list[MoveResult], msgspec.Meta(max_length=MAX_BATCH)]

    def call(self, m: StoreMaster) -> int:
        return m.moves_done(self.client_id, self.results)


SegmentName = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class BatchAddReplicaStart(_Req, tag="batch_add_replica_start"):
    """New replicas of complete objects on `segment` (see store/replicas_add.py); a single
    add is a batch of one."""

    keys: Keys
    segment: SegmentName
    sizes: Annotated[list[Size], msgspec.Meta(max_length=MAX_BATCH)]

    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_add_replica_start(self.keys, self.segment, self.sizes)


class BatchAddReplicaEnd(_Req, tag="batch_add_replica_end"):
    keys: Keys
    segment: SegmentName
    checksums: Annotated[list[Checksum], msgspec.Meta(max_length=MAX_BATCH)]

    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_add_replica_end(self.keys, self.segment, self.checksums)


class BatchAddReplicaRevoke(_Req, tag="batch_add_replica_revoke"):
    keys: Keys
    segment: SegmentName

    def call(self, m: StoreMaster) -> list[Any]:
        return m.batch_add_replica_revoke(self.keys, self.segment)


class PollHoldings(_Req, tag="poll_holdings"):
    """A client's heartbeat that also fetches what changed in its DRAM segment since `ack` of
    journal `epoch` (store/reports.py); answers a HoldingsReport. With `wait` > 0 the master
    may hold an empty answer up to `wait` seconds, until a change comes (a long poll)."""

    client_id: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    epoch: Annotated[str, msgspec.Meta(max_length=64)] = ""
    ack: Annotated[int, msgspec.Meta(ge=0)] = 0
    wait: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.0

    def call(self, m: StoreMaster) -> HoldingsReport:
        return m.poll_holdings(self.client_id, self.epoch, self.ack)


class RegisterHeld(_Req, tag="register_held"):
    """A client re-announces the replicas its segment holds to a master that forgot it."""

    held: Annotated[list[Held], msgspec.Meta(max_length=MAX_BATCH)]

    def call(self, m: StoreMaster) -> list[Any]:
        return m.register_held(self.held)


class Remount(_Req, tag="remount"):
    """A client whose master forgot it mounts its segment again together with the replicas
    it holds there, in one step: nothing can be placed over them in between. Per held
    replica None or its error, as RegisterHeld."""

    segment: Mount
    held: Annotated[list[Held], msgspec.Meta(max_length=MAX_BATCH)]
    ledger_next: Annotated[int, msgspec.Meta(ge=1, lt=1 << 62)] = 1

    def call(self, m: StoreMaster) -> list[Any]:
        with m.state.lock:
            m.mount_segment(self.segment)
            return m.register_held(self.held)


Request = Union[  # noqa: UP007 - msgspec wants a real Union of the tagged structs
    MountSegment, UnmountSegment, Heartbeat, PutStart, PutEnd, PutRevoke, GetReplicaList,
    Exists, Describe, Remove, RemoveAll, List, Stats, RegisterExisting, BatchPutStart,
    BatchPutEnd, BatchPutRevoke, BatchGetReplicaList, BatchExists, BatchRemove, WhoLeads,
    PollMoves, MovesDone, BatchAddReplicaStart, BatchAddReplicaEnd, BatchAddReplicaRevoke,
    PollHoldings, RegisterHeld, Remount, BatchDescribe, BatchReplicaClear, GetFsdir,
]
BATCHES = (BatchPutStart, BatchPutEnd, BatchPutRevoke, BatchGetReplicaList, BatchExists,
           BatchDescribe, BatchRemove, BatchAddReplicaStart, BatchAddReplicaEnd,
           BatchAddReplicaRevoke, RegisterHeld, Remount)
