"""The hand-off between pipeline stages (engine/stages.py) through the transfer engine.

Every stage, the lead included, owns an `Inbox`: a registered, guarded tensor of one hidden
state per prompt token. For each chunk of the prompt, a stage WRITEs the chunk's hidden states
after its layers into the next stage's inbox (row t at `inbox + t * row_bytes`) and the KV
slices of its layers of the blocks the chunk completed into the lead's pool (at the offsets
the plan lists, inside the block where a single instance keeps it), all in one batch; once
the batch has landed it sends the next stage a `ChunkReady` (a small signed JSON POST, the
control channel the workers already use) that only says which rows are there. The last stage
sends the lead the prompt's last row only, with its final notice; as each stage waits for
its writes before its notice, the lead then has every block whole in its pool.

A stage never reads the store: the lead loads the reused prefix and WRITEs each stage its
slice of those blocks before its first notice, and the lead alone puts blocks and streams
them to the decode worker (what it holds then is byte for byte a single instance's).

    lead --begin(plan)--> stage (last stage first: each plan names the next inbox)
    lead --WRITE prefix slices--> stages
    per chunk: stage k --WRITE rows, KV slices--> stage k+1, lead; --ChunkReady--> stage k+1
"""

from __future__ import annotations

import queue
import threading
import time

import torch
from pydantic import BaseModel, Field

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.http.auth import Signer
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

# seconds a write capability for one request lasts at most: it is revoked when the request
# ends, so this only bounds a leak, and must outlast the longest prefill (8k tokens on a CPU)
GRANT_TTL = 1800.0


class Target(BaseModel):
    """Registered memory of a peer: its segment and a capability (hex) for WRITEs there."""

    segment: str
    capability: str = ""

    def token(self) -> bytes | None:
        return bytes.fromhex(self.capability) if self.capability else None


class StagePlan(BaseModel):
    """Lead -> stage: run layers [lo, hi) of a `num_tokens` prompt from token `start` (the
    tokens before it are a reused prefix whose slices the lead writes first)."""

    request_id: str
    num_tokens: int = Field(ge=1)
    start: int = Field(ge=0)
    lo: int = Field(ge=0)
    hi: int = Field(ge=1)
    lead_url: str  # where a stage that gives up says so (/v1/stage/release)
    next_url: str  # where this stage's ChunkReady notices go
    next_inbox: Target
    next_rows: int  # offset of the next stage's inbox (row t at next_rows + t * row_bytes)
    last: bool  # the next is the lead: send it the prompt's last row only
    gather: Target  # the lead's pool
    gather_at: list[int]  # per block of the prompt, where this stage's slice of it goes


class StageGrant(BaseModel):
    """Stage -> lead: where the lead and the previous stage write for this request."""

    request_id: str
    inbox: Target
    rows: int  # offset of row 0 of the inbox
    row_bytes: int
    slices: list[int]  # per block of the reused prefix, where its slice goes
    slice_bytes: int


class ChunkReady(BaseModel):
    """Rows [start, start + n) of the prompt are in your inbox (the last stage's notices to
    the lead carry no rows but the last one's, with `final`)."""

    request_id: str
    start: int = Field(ge=0)
    n: int = Field(ge=1)
    final: bool = False


class StageRelease(BaseModel):
    """Either way: the lead gives a stage's request up, or a stage tells the lead it failed."""

    request_id: str
    reason: str = ""


class Inbox:
    """One hidden state per prompt token, registered (guarded) with `engine`, and the
    ChunkReady notices of the request being served."""

    def __init__(self, engine: TransferEngine, rows: int, hidden: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.engine = engine
        self.rows = torch.zeros((rows, hidden), dtype=dtype, device=device)
        self.region = engine.register(self.rows, guarded=True)
        self.row_bytes = hidden * self.rows.element_size()
        self._notices: queue.Queue[ChunkReady | str] = queue.Queue()
        self._lock = threading.Lock()
        self.request_id: str | None = None

    def open(self, request_id: str, num_tokens: int, extra: list[tuple[int, int]]) -> Target:
        """Take notices for `request_id`; a capability for its rows and the `extra` ranges
        (offset, length) of this engine's segment."""
        if num_tokens > self.rows.shape[0]:
            raise ServingError(ErrorCode.INVALID_REQUEST, f"a prompt of {num_tokens} tokens "
                               f"does not fit this stage's {self.rows.shape[0]} rows")
        with self._lock:
            self.request_id = request_id
            self._notices = queue.Queue()
        ranges = [(self.region.base, num_tokens * self.row_bytes), *extra]
        token = self.engine.grants.issue(request_id, ranges, GRANT_TTL)
        return Target(segment=self.engine.name, capability=token.hex())

    def close(self, request_id: str, reason: str = "released") -> None:
        """No more writes or notices for `request_id`; a `take` waiting for one raises
        PREFILL_FAILED saying `reason`."""
        self.engine.grants.revoke(request_id)
        with self._lock:
            if self.request_id == request_id:
                self.request_id = None
                self._notices.put(f"pipeline request {request_id}: {reason}")

    def post(self, notice: ChunkReady) -> None:
        """A notice from the previous stage (the control route calls this)."""
        with self._lock:
            if notice.request_id != self.request_id:
                raise ServingError(ErrorCode.NOT_FOUND,
                                   f"no pipeline request {notice.request_id} here")
            self._notices.put(notice)

    def take(self, timeout: float) -> ChunkReady:
        """The next notice, waiting up to `timeout` seconds for it."""
        try:
            notice = self._notices.get(timeout=timeout)
        except queue.Empty:
            raise ServingError(ErrorCode.PREFILL_FAILED, f"pipeline request {self.request_id}: "
                               f"no chunk from the previous stage in {timeout:g} s") from None
        return self._check(notice)

    def poll(self) -> ChunkReady | None:
        """The next notice if one has come."""
        try:
            return self._check(self._notices.get_nowait())
        except queue.Empty:
            return None

    @staticmethod
    def _check(notice: ChunkReady | str) -> ChunkReady:
        if isinstance(notice, str):
            raise ServingError(ErrorCode.PREFILL_FAILED, notice)
        return notice

    def take_rows(self, notice: ChunkReady) -> torch.Tensor:
        return self.rows[notice.start:notice.start + notice.n]


class Outbox:
    """A stage's hidden states staged in registered memory for WRITEs to the next inbox."""

    def __init__(self, engine: TransferEngine, rows: int, hidden: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.rows = torch.zeros((rows, hidden), dtype=dtype, device=device)
        self.region = engine.register(self.rows)
        self.row_bytes = hidden * self.rows.element_size()

    def stage(self, start: int, hidden: torch.Tensor) -> int:
        """Copy rows `start`.. in; the offset of row `start` in the region."""
        self.rows[start:start + hidden.shape[0]].copy_(hidden)
        return start * self.row_bytes


def write(local: Region, offset: int, length: int, target: Target,
          dest: int) -> TransferRequest:
    """A WRITE of bytes [offset, offset + length) of `local` to `dest` of the target."""
    return TransferRequest(Op.WRITE, local, offset, target.segment, dest, length,
                           target.token())


def run(engine: TransferEngine, reqs: list[TransferRequest], timeout: float, what: str) -> int:
    """Submit `reqs` as one batch and wait for all of them; the bytes moved. PREFILL_FAILED
    naming the first failure (the lead then runs the request on one instance)."""
    if not reqs:
        return 0
    deadline = time.monotonic() + timeout
    statuses = engine.submit(reqs).wait(max(0.0, deadline - time.monotonic()))
    bad = [st for st in statuses if st.state is not State.COMPLETED]
    if bad:
        raise ServingError(ErrorCode.PREFILL_FAILED,
                           f"{what} failed: {bad[0].reason or 'timed out'}")
    return sum(r.length for r in reqs)


def post(url: str, path: str, message: BaseModel, auth: Signer | None,
         timeout: float) -> dict[str, object]:
    """POST a control message to a stage's `path`; its answer, or PREFILL_FAILED."""
    try:
        answer = call(url.rstrip("/") + path, message.model_dump(), timeout=timeout, auth=auth)
    except (OSError, ValueError) as e:
        raise ServingError(ErrorCode.PREFILL_FAILED, f"stage {url} unreachable: {e}") from None
    if answer.status != 200:
        raise ServingError(ErrorCode.PREFILL_FAILED, f"stage {url} refused {path}: "
                           f"{answer.body}")
    return answer.body


def reachable(url: str, timeout: float = 2.0) -> bool:
    """Whether the stage at `url` still answers /health (a lead waiting for a stage's notice
    tells a dead stage from a slow one by this)."""
    try:
        return call(url.rstrip("/") + "/health", timeout=timeout).status == 200
    except (OSError, ValueError):
        return False


def notify(url: str, notice: ChunkReady, auth: Signer | None, timeout: float) -> None:
    """Tell the stage at `url` that the chunk's rows are in its inbox."""
    post(url, "/v1/stage/chunk", notice, auth, timeout)
