"""The compat store's replica tasks (upstream's create_copy_task, create_move_task, query_task):
copy an object to more segments, or move its replica from one segment to another. Segments are
named as `get_hostname()` names them.

Upstream's master queues a task for a client to run; here the calling client copies before
answering (the bytes read once from a replica, checked against the object's checksum, written
by a replica add), and a move's source replica is dropped (a replica clear) by a thread of
this client as soon as no read holds a lease on it (PROCESSING until then, FAILED after
MOVE_WAIT seconds). `query_task` knows the tasks of the store object that created them.
Codes as upstream's: creation ((0, 0), -704) for a missing key and -600 for a bad segment;
query (None, -1400)."""

from __future__ import annotations

import enum
import secrets
import threading
import time

from mooncake_cli.compat.codes import BAD
from mooncake_cli.compat.connection import Client, Connection
from mooncake_cli.store.errors import ObjectAlreadyExists, StoreCode, StoreError

TASK_NOT_FOUND = -1400
MOVE_WAIT = 30.0  # seconds a move waits for the leases on its source replica to run out
NO_TASK = (0, 0)
_BAD_SEGMENT = (StoreCode.SEGMENT_NOT_FOUND, StoreCode.INVALID_PARAMS)


class TaskStatus(enum.IntEnum):
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class TaskType(enum.IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class QueryTaskResponse:
    """What query_task tells of a task (upstream's fields)."""

    def __init__(self, id: tuple[int, int], type: TaskType, assigned_client: tuple[int, int]
                 ) -> None:
        self.id, self.type, self.assigned_client = id, type, assigned_client
        self.status = TaskStatus.PROCESSING
        self.message = ""
        self.created_at_ms_epoch = self.last_updated_at_ms_epoch = int(time.time() * 1000)

    def end(self, error: StoreError | None) -> None:
        self.status = TaskStatus.SUCCESS if error is None else TaskStatus.FAILED
        self.message = "Task completed successfully" if error is None else str(error)
        self.last_updated_at_ms_epoch = int(time.time() * 1000)


def _uuid() -> tuple[int, int]:
    return secrets.randbits(64), secrets.randbits(64)


def _add(c: Client, key: str, data: bytes, segment: str) -> StoreError | None:
    err = c.batch_add_replica([key], [data], segment)[0]
    return None if isinstance(err, ObjectAlreadyExists) else err


def _clear(c: Client, task: QueryTaskResponse, key: str, source: str) -> None:
    """Drop the source replica of a move once no lease holds it."""
    deadline = time.monotonic() + MOVE_WAIT
    while True:
        try:
            if key in c.batch_replica_clear([key], source):
                task.end(None)
                return
            if source not in {r.segment for r in c.describe(key).replicas}:
                task.end(StoreError(f"{key!r} has no replica on {source}",
                                    StoreCode.INVALID_REPLICA))
                return
        except StoreError as e:
            task.end(e)
            return
        if time.monotonic() > deadline:
            task.end(StoreError(f"{key!r} kept its replica on {source}: leased for "
                                f"{MOVE_WAIT:.0f} s", StoreCode.OBJECT_HAS_LEASE))
            return
        time.sleep(0.05)


class ReplicaTasks:
    """The copy and move tasks one compat store created (query_task knows these only)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._tasks: dict[tuple[int, ...], QueryTaskResponse] = {}
        self._client_uuid = _uuid()  # upstream's assigned_client

    def _task(self, kind: TaskType, key: str, segments: list[str],
              source: str = "") -> tuple[tuple[int, int], int]:
        if not isinstance(key, str) or not segments or \
                not all(isinstance(s, str) and s for s in segments):
            return NO_TASK, BAD

        def go(c: Client) -> tuple[tuple[int, int], int]:
            meta = c.describe(key)  # no lease: a move may clear the source after the copy
            data = c.io.read_bytes(key, meta.replicas)
            task = QueryTaskResponse(_uuid(), kind, self._client_uuid)
            error: StoreError | None = None
            for target in segments:
                error = _add(c, key, data, target)
                if error is not None and error.code in _BAD_SEGMENT and target not in \
                        {r.segment for r in c.describe(key).replicas}:
                    return NO_TASK, BAD
                if error is not None:
                    break
            self._tasks[task.id] = task
            if error is None and source:
                threading.Thread(target=_clear, args=(c, task, key, source), daemon=True,
                                 name="mooncake-move").start()
            else:
                task.end(error)
            return task.id, 0
        return self._conn.run(go, lambda e: (NO_TASK, e))

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        """Copy the object of `key` to each segment of `targets`: (task id, 0) or ((0, 0),
        code)."""
        return self._task(TaskType.REPLICA_COPY, key, list(targets))

    def create_move_task(self, key: str, source: str,
                         target: str) -> tuple[tuple[int, int], int]:
        """Move the replica of `key` on segment `source` to segment `target`."""
        if source == target or not isinstance(source, str) or not source:
            return NO_TASK, BAD
        return self._task(TaskType.REPLICA_MOVE, key, [target], source)

    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        try:
            task = self._tasks.get(tuple(task_id))
        except TypeError:
            return None, BAD
        return (task, 0) if task is not None else (None, TASK_NOT_FOUND)
