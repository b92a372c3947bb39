"""The records conductors share through etcd: where each one lives and how it is sealed.

    /mooncake/conductors/CLUSTER/members/CID         {"conductor", "url"}
    /mooncake/conductors/CLUSTER/bookings/CID/RID    {"conductor", "decode", "tokens"}
    /mooncake/conductors/CLUSTER/index/CID/SLOT      {"conductor", "instance", "prefix",
                                                      "touched", "stored", "evicted"}

Members and bookings hang on the conductor's lease (they go when it dies); index records on a
longer lease of their own (`mooncake_cli.conductor.peer_publisher`). Each record carries its
own key and lease id; with the cluster secret it is signed (`mooncake_cli.http.auth.sign_record`)
and a reader takes it only when the MAC is right and the key and lease it names are the ones
etcd holds it under: a record copied to another key, or put back once its lease is gone, is
refused. (That binding, not the signature's age, stops replays: a booking may live for as long
as its answer streams.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mooncake_cli.conductor.etcd_watch import Entry
from mooncake_cli.http.auth import sign_record, verify_record

PREFIX = "/mooncake/conductors/"
KINDS = ("members", "bookings", "index")


@dataclass(frozen=True)
class Layout:
    """The keys of one cluster's conductors."""

    cluster: str

    @property
    def base(self) -> str:
        return f"{PREFIX}{self.cluster}/"

    def member(self, cid: str) -> str:
        return f"{self.base}members/{cid}"

    def booking(self, cid: str, rid: str) -> str:
        return f"{self.base}bookings/{cid}/{rid}"

    def index(self, cid: str, slot: int) -> str:
        return f"{self.base}index/{cid}/{slot}"

    def kind(self, key: str) -> str | None:
        """"members", "bookings" or "index" for a key of this layout; None otherwise."""
        if not key.startswith(self.base):
            return None
        kind = key[len(self.base):].partition("/")[0]
        return kind if kind in KINDS else None


def seal(secret: str, key: str, lease: int, body: dict[str, Any]) -> str:
    """The JSON etcd keeps at `key` under `lease` for `body` (signed with `secret` if any)."""
    record = {**body, "key": key, "lease": str(lease)}
    return json.dumps(sign_record(secret, record) if secret else record,
                      separators=(",", ":"))


def unseal(secret: str, entry: Entry) -> dict[str, Any]:
    """The body of a sealed record; ValueError when it is not a JSON object, its signature is
    missing or wrong (with a secret), or it names another key or lease than its own."""
    try:
        record = json.loads(entry.value)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a JSON object, not {record!r:.60}")
    if secret:
        record = verify_record(secret, record, max_age=None)
    if record.get("key") != entry.key or record.get("lease") != str(entry.lease):
        raise ValueError(f"the record names key {record.get('key')!r:.80} and lease "
                         f"{record.get('lease')!r:.24}, not its own")
    if not isinstance(record.get("conductor"), str):
        raise ValueError("the record names no conductor")
    return {k: v for k, v in record.items() if k not in ("key", "lease")}
