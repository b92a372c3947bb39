"""The messages between the conductor and the workers (and between the workers).

    conductor -> prefill   POST /v1/prefill        PrefillRequest -> PrefillAnswer
    lead      -> stage     POST /v1/stage/...      worker/pipeline.py (a pipelined prefill)
    prefill   -> decode    POST /v1/kv/reserve     ReserveRequest -> ReserveAnswer
    prefill   -> decode    POST /v1/kv/release     ReleaseRequest -> ReleaseAnswer
    conductor -> decode    POST /v1/generate       GenerateRequest -> SSE TokenEvent..., FinalEvent
    worker    -> conductor POST /v1/instances/register    Registration (with its Load)
    worker    -> conductor POST /v1/instances/deregister  Deregistration
    anyone    -> worker    GET /health -> Health, GET /v1/load -> Load

`sampling` is the engine's own `SamplingParams`: one type from the OpenAI request to the
sampler. Requests are strict (unknown fields refused); answers read from peers tolerate
fields added by newer peers.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from mooncake_cli.api.errors import bad
from mooncake_cli.api.indexer import zmq_endpoint
from mooncake_cli.api.schema import Message
from mooncake_cli.engine.sampling import SamplingParams

RequestId = Annotated[str, Field(min_length=1, max_length=256)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Count = Annotated[int, Field(ge=0)]
Role = Literal["prefill", "decode"]
Reuse = Literal["any", "local", "none"]


class Answer(Message):
    """A peer's answer: strict types, but fields it may add later are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


MAX_STAGES = 8  # pipeline stages of one prefill at most, the lead included


class Pipeline(Message):
    """Run this prefill as a pipeline: the lead (the worker asked) runs the first share of the
    layers and hands each `chunk_tokens`-token chunk's hidden states to `stages` (other
    prefill workers' URLs, in order), which run the next shares (layers split evenly)."""

    stages: Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]],
                      Field(min_length=1, max_length=MAX_STAGES - 1)]
    chunk_tokens: Annotated[int, Field(ge=1)] = 2048

    @field_validator("stages")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        if not all(u.startswith("http") for u in v) or len(set(v)) != len(v):
            raise bad("'pipeline.stages' must be distinct prefill worker URLs "
                      "(http://HOST:PORT)", "pipeline")
        return v


class PrefillRequest(Message):
    request_id: RequestId
    token_ids: TokenIds | None = None
    prompt: Annotated[str, Field(min_length=1)] | None = None
    decode: str | None = None  # http://HOST:PORT of the decode worker to stream the KV to
    sampling: SamplingParams = SamplingParams()
    reuse: Reuse = "any"  # which stored prefix blocks may be loaded
    pipeline: Pipeline | None = None  # None: this worker alone
    prefetch: bool = True  # pull its stored prefix here while it waits behind others

    @model_validator(mode="after")
    def _prompt_given(self) -> PrefillRequest:
        if self.token_ids is None and self.prompt is None:
            raise bad("give 'token_ids' (a list of ids) or 'prompt' (a string)", "token_ids")
        if self.decode is not None and not self.decode.startswith("http"):
            raise bad("'decode' must be a decode worker URL (http://HOST:PORT) or null",
                      "decode")
        return self


class PrefillTiming(Answer):
    queue: float = 0.0
    load: float = 0.0
    compute: float = 0.0
    store: float = 0.0
    transfer: float = 0.0
    replicate: float = 0.0
    total: float = 0.0


class PipelineReport(Answer):
    """How a pipelined prefill went: the stages it ran on (none when it fell back to the
    lead alone, `fallback` saying why), and the lead's hand-off figures in seconds."""

    stages: list[str] = []
    layers: list[list[int]] = []  # [lo, hi) per stage, the lead's first
    chunk_tokens: int = 0
    fallback: str = ""
    begin: float = 0.0  # setting the stages up
    compute: float = 0.0  # the lead's own layers over every chunk
    handoff: float = 0.0  # the lead's writes and notices of its chunks
    drain: float = 0.0  # waiting for the last stage after the lead's last chunk
    bytes_sent: int = 0


class FetchedFrom(Answer):
    """KV bytes a prefill read from another segment while loading its prefix, and the
    seconds its transfer engine took for them (the engine's link statistics)."""

    segment: str
    bytes: Count
    seconds: Annotated[float, Field(ge=0)]


class PrefillAnswer(Answer):
    request_id: str
    first_token: Count
    prompt_tokens: Count
    cached_tokens: Count = 0
    stored_keys: list[str] = []
    replicated_keys: list[str] = []
    finish_reason: str | None = None
    timing: PrefillTiming = PrefillTiming()
    token_ids: list[int] | None = None  # when the request gave a prompt string
    pipeline: PipelineReport | None = None  # when the request asked for a pipeline
    fetched: list[FetchedFrom] = []  # per segment read from over the network
    prefetched: Count = 0  # prefix blocks a prefetch pulled here before the prefill began


class PrefetchRequest(Message):
    """Pull the stored prefix of a request that waits for this worker (worker/prefetch.py)."""

    request_id: RequestId
    token_ids: TokenIds


class PrefetchAnswer(Answer):
    request_id: str
    started: bool  # False: this worker cannot prefetch (no own segment) or too many wait
    state: str = ""  # the prefetch's state when answered (waiting, pulling, done, ...)


class ReserveRequest(Message):
    request_id: RequestId
    num_tokens: Annotated[int, Field(ge=1)]
    max_tokens: Count = 0


class ReserveAnswer(Answer):
    segment: Annotated[str, Field(min_length=1)]
    engine: str = ""
    block_ids: list[Count]
    block_bytes: Annotated[int, Field(ge=1)]
    base: Count = 0
    capability: Annotated[str, Field(max_length=128)] = ""  # hex write capability ("": none)
    kv_wire: Literal["native", "int8"] = "native"  # the form the blocks must be written in


class ReleaseRequest(Message):
    request_id: RequestId


class RequestRef(Answer):
    """Only the request id of a message (to clean up after a refused one)."""

    request_id: str


class ReleaseAnswer(Answer):
    request_id: str
    released_blocks: Count


class Resume(Message):
    """A request moved from a decode worker that failed: the last tokens of `token_ids` were
    generated there (and streamed), not part of the prompt."""

    prompt_tokens: Annotated[int, Field(ge=1)]  # how many of token_ids are the prompt
    sent_chars: Count = 0  # characters of the generated text the client has had already


class GenerateRequest(Message):
    request_id: RequestId
    token_ids: TokenIds
    first_token: Count
    sampling: SamplingParams = SamplingParams()
    stream: bool = True  # False: one GenerateAnswer when the request is done
    resume: Resume | None = None

    @model_validator(mode="after")
    def _resume_fits(self) -> GenerateRequest:
        if self.resume is not None and self.resume.prompt_tokens > len(self.token_ids):
            raise bad(f"resume.prompt_tokens {self.resume.prompt_tokens} exceeds the "
                      f"{len(self.token_ids)} token ids", "resume")
        return self


class GenerateAnswer(Answer):
    """A whole generation: its TokenEvents, then its FinalEvent."""

    events: list[dict[str, Any]]


class TokenEvent(Answer):
    token: int
    text: str = ""


class FinalEvent(Answer):
    finish_reason: str | None = None
    completion_tokens: Count = 0
    error: str | None = None


class Load(Answer):
    """A worker's load, as polled or sent with each registration."""

    role: Role | None = None
    running: Count = 0
    waiting: Count = 0
    free_blocks: Count = 0
    total_blocks: Count = 0
    recent_step_s: float = 0.0
    queued_prefill_tokens: Count = 0
    preempted: Count = 0  # decode: sequences parked now, and the totals so far
    preemptions: Count = 0
    parked_blocks: Count = 0
    reloaded_blocks: Count = 0
    recomputed_tokens: Count = 0

    @field_validator("recent_step_s")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError("must be a number of seconds >= 0")
        return v

    @model_validator(mode="after")
    def _free_within_total(self) -> Load:
        if self.total_blocks and self.free_blocks > self.total_blocks:
            raise ValueError(f"free_blocks {self.free_blocks} is over total_blocks "
                             f"{self.total_blocks}")
        return self


class KvEvents(Message):
    """Where a worker's engine publishes its KV events (vLLM's `--kv-events-config`: ZMQ PUB
    batches, docs/indexer.md): the conductor subscribes and routes on what they say the
    worker holds. `block_size` is the engine's."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    endpoint: str
    replay_endpoint: str | None = None
    block_size: Annotated[int, Field(ge=1, le=1 << 16)]

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq(cls, v: str | None, info: ValidationInfo) -> str | None:
        return zmq_endpoint(v, f"kv_events.{info.field_name}")


class Registration(Message):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    name: Annotated[str, Field(min_length=1, max_length=512)]
    role: Role
    url: str
    model: str = ""
    block_size: int = 0
    load: Load = Load()
    token: Annotated[str, Field(max_length=256)] = ""  # binds the name to this registrant
    kv_events: KvEvents | None = None  # an engine publishing its KV events (vLLM's)


class Deregistration(Message):
    name: Annotated[str, Field(min_length=1)]
    token: Annotated[str, Field(max_length=256)] = ""


class Health(Answer):
    status: str
    role: Role
    name: str
    model: str = ""
    block_size: int = 0
