"""`mooncake prefill` and `mooncake decode`: serve a model as a worker until Ctrl-C."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from mooncake_cli.commands import common as c
from mooncake_cli.config import help_of, load
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.heap import tune_heap
from mooncake_cli.output import Out
from mooncake_cli.registry import Registry

W = WorkerConfig


def _opt(flag: str, name: str, metavar: str | None = None) -> Any:
    """The typer option of WorkerConfig field `name`: its help is the field's description."""
    return typer.Option(None, flag, metavar=metavar, help=help_of(W, name))


MODEL = _opt("--model", "model", "DIR|FILE|NAME")
ENGINE = _opt("--engine", "engine", "native|vllm")
DEVICE = _opt("--device", "device")
DTYPE = _opt("--dtype", "dtype")
THREADS = _opt("--threads", "threads", "N")
KV_WIRE = _opt("--kv-wire", "kv_wire", "native|int8")
STORE = _opt("--store", "store", "MASTER|none")
SEGMENT = _opt("--segment-size", "segment_size")
LISTEN = _opt("--listen", "listen", "HOST:PORT")
ADVERTISE = _opt("--advertise", "advertise", "HOST")
BLOCK = _opt("--block-size", "block_size", "TOKENS")
BLOCKS = _opt("--kv-blocks", "kv_blocks", "N")
CHUNK = _opt("--chunk-size", "chunk_size", "TOKENS")
CONDUCTOR = _opt("--conductor", "conductor", "URL")
NAME = _opt("--name", "name", "NAME")
HEARTBEAT = _opt("--heartbeat", "heartbeat", "SECONDS")
AUDIT = _opt("--audit-log", "audit_log", "FILE")
WRITE_BEHIND = typer.Option(None, "--write-behind/--no-write-behind",
                            help=help_of(W, "write_behind"))
SECRET = typer.Option(None, "--secret", envvar="MOONCAKE_SECRET", show_envvar=True,
                      help="Cluster secret: every request to this worker but /health and "
                           "/metrics must be signed with it, and the store and transfer "
                           "connections prove it; required beyond loopback.")
if TYPE_CHECKING:
    from mooncake_cli.worker.engines import Worker


def _ready_text(role: str, worker: Worker, cfg: WorkerConfig, info: dict[str, Any]) -> str:
    """The ready line: the engine's own (`ready_text`), or the native worker's."""
    own = getattr(worker, "ready_text", None)
    if own is not None:
        return str(own()) + "\nCtrl-C to stop."
    return (f"{role} worker [bold]{escape(worker.name)}[/bold] at "
            f"[bold]{escape(worker.url)}[/bold]\n"
            f"  model: {escape(info['description'])}\n"
            f"  KV: {cfg.kv_blocks} blocks of {cfg.block_size} tokens, "
            f"segment {escape(info['segment'])}, store "
            f"{escape(info['store'] or 'none')}\nCtrl-C to stop.")


def _serve(out: Out, role: str, secret: str | None, secret_file: str | None,
           **flags: Any) -> None:
    cfg = load(WorkerConfig, role, out.config_file, role=role, **flags)
    tcfg = c.cluster_config(out, secret, secret_file)
    from mooncake_cli.worker.engines import worker_class

    kind = worker_class(cfg.engine, role)
    tune_heap()  # the worker's store client reads values
    with c.stop_signals() as stop:
        worker = kind(cfg, tcfg, Registry.from_env())
        try:
            worker.start()
            info = worker.describe()
            out.event(info, _ready_text(role, worker, cfg, info))
            c.wait_for_signal(stop)
            out.event({"event": "stopping", "name": worker.name},
                      "stopping: finishing in-flight requests")
        finally:
            worker.close()
    out.event({"event": "stopped", "name": worker.name},
              "stopped; deregistered, store segment unmounted")


def prefill(ctx: typer.Context, model: str = MODEL, engine: str = ENGINE, device: str = DEVICE,
            dtype: str = DTYPE, kv_wire: str = KV_WIRE,
            threads: int = THREADS,
            store: str = STORE, segment_size: str = SEGMENT, listen: str = LISTEN,
            advertise: str = ADVERTISE, block_size: int = BLOCK, kv_blocks: int = BLOCKS,
            chunk_size: int = CHUNK,
            conductor: str = CONDUCTOR, name: str = NAME, heartbeat: float = HEARTBEAT,
            audit_log: str = AUDIT, secret: str = SECRET,
            secret_file: str = c.SECRET_FILE) -> None:
    """Serve prefill: reuse stored prefix blocks, compute the rest in chunks, store new blocks
    and stream the KV to a decode worker (POST /v1/prefill)."""
    _serve(ctx.obj, "prefill", secret, secret_file, model=model, engine=engine, device=device,
           dtype=dtype, kv_wire=kv_wire,
           threads=threads,
           store=store,
           segment_size=segment_size, listen=listen, advertise=advertise,
           block_size=block_size,
           kv_blocks=kv_blocks, chunk_size=chunk_size, conductor=conductor, name=name,
           heartbeat=heartbeat, audit_log=audit_log)


def decode(ctx: typer.Context, model: str = MODEL, engine: str = ENGINE, device: str = DEVICE,
           dtype: str = DTYPE, kv_wire: str = KV_WIRE,
           threads: int = THREADS,
           store: str = STORE, segment_size: str = SEGMENT, listen: str = LISTEN,
           advertise: str = ADVERTISE, block_size: int = BLOCK, kv_blocks: int = BLOCKS,
           chunk_size: int = CHUNK,
           conductor: str = CONDUCTOR, name: str = NAME, heartbeat: float = HEARTBEAT,
           audit_log: str = AUDIT, write_behind: bool = WRITE_BEHIND, secret: str = SECRET,
           secret_file: str = c.SECRET_FILE) -> None:
    """Serve decode: KV reservations filled by prefill workers, continuous batching, tokens
    streamed as server-sent events (POST /v1/kv/reserve, /v1/generate, /v1/kv/release).
    With --store it contributes --segment-size of DRAM to the store's pool."""
    _serve(ctx.obj, "decode", secret, secret_file, model=model, engine=engine, device=device,
           dtype=dtype, kv_wire=kv_wire,
           threads=threads,
           store=store,
           segment_size=segment_size, listen=listen, advertise=advertise,
           block_size=block_size,
           kv_blocks=kv_blocks, chunk_size=chunk_size, conductor=conductor, name=name,
           heartbeat=heartbeat, audit_log=audit_log, write_behind=write_behind)
