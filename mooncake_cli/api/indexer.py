"""The KV indexer API's messages (upstream Mooncake's conductor indexer, also Dynamo's
standalone indexer; docs/indexer.md), field names as the spec has them.

    POST /register        Register -> Registered
    POST /unregister      Unregister -> Unregistered
    POST /query           Query -> QueryAnswer
    POST /query_by_hash   QueryByHash -> QueryAnswer

A QueryAnswer is {tenant: {instance: InstanceMatch}}; every figure is in tokens.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, Field, RootModel, field_validator

from mooncake_cli.api.errors import bad
from mooncake_cli.api.schema import Message

Name = Annotated[str, Field(min_length=1, max_length=256)]
Salt = Annotated[str, Field(max_length=256)]
BlockSize = Annotated[int, Field(ge=1, le=1 << 16)]
Rank = Annotated[int, Field(ge=0, le=1 << 16)]
Kind = Literal["vLLM", "SGLang", "Mooncake"]
MAX_TOKENS = 1 << 20  # token ids of one /query
MAX_HASHES = 1 << 16  # hashes of one /query_by_hash
_ENDPOINT = re.compile(r"^(tcp://[A-Za-z0-9.\-\[\]:]+:\d{1,5}|ipc://[^\s]+)$")


def zmq_endpoint(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    if len(value) > 256 or not _ENDPOINT.match(value) or "*" in value:
        raise bad(f"'{name}' must be a ZMQ address to connect to: tcp://HOST:PORT or "
                  f"ipc://PATH, not {value[:80]!r}", name)
    return value


class Unregister(Message):
    type: Kind
    modelname: Name
    lora_name: Name | None = None
    tenant_id: Name = "default"
    instance_id: Name
    block_size: BlockSize
    dp_rank: Rank = 0


class Register(Unregister):
    endpoint: str  # the publisher's ZMQ PUB socket
    replay_endpoint: str | None = None  # its ZMQ ROUTER for missed batches
    additionalsalt: Salt | None = None

    @field_validator("endpoint")
    @classmethod
    def _pub(cls, v: str) -> str:
        return zmq_endpoint(v, "endpoint") or v

    @field_validator("replay_endpoint")
    @classmethod
    def _replay(cls, v: str | None) -> str | None:
        return zmq_endpoint(v, "replay_endpoint")


class Query(Message):
    model: Name
    lora_name: Name | None = None
    token_ids: Annotated[list[Annotated[int, Field(ge=0, lt=1 << 32)]],
                         Field(max_length=MAX_TOKENS)]
    tenant_id: Name = "default"
    instance_id: Name | None = None
    block_size: BlockSize
    cache_salt: Salt | None = None


class QueryByHash(Message):
    """`seq_hashes` (or `block_hash`): the spec's rolling sequence hashes, u64 (a negative
    i64 is read as its two's complement, for callers that keep them signed)."""

    model: Name
    lora_name: Name | None = None
    seq_hashes: Annotated[list[Annotated[int, Field(ge=-(1 << 63), lt=1 << 64)]],
                          Field(max_length=MAX_HASHES,
                                validation_alias=AliasChoices("seq_hashes", "block_hash"))]
    tenant_id: Name = "default"
    instance_id: Name | None = None
    block_size: BlockSize
    cache_salt: Salt | None = None

    @field_validator("seq_hashes")
    @classmethod
    def _unsigned(cls, v: list[int]) -> list[int]:
        return [h & ((1 << 64) - 1) for h in v]


class Registered(BaseModel):
    status: str = "registered successfully"
    instance_id: str


class Unregistered(BaseModel):
    status: str = "unregistered successfully"
    removed_instances: list[str]  # "<instance>|<tenant>|<dp_rank>"


class InstanceMatch(BaseModel):
    """Tokens of the query's prefix an instance holds: in any tier (`longest_matched`), on
    each tier alone, and per dp rank (in any tier); the instance's figures are its best
    rank's."""

    longest_matched: int
    GPU: int
    CPU: int
    DISK: int
    DP: dict[str, int]


class QueryAnswer(RootModel[dict[str, dict[str, InstanceMatch]]]):
    pass

