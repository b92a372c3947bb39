"""`mooncake prefill` and `mooncake decode`: serve a model as a worker until Ctrl-C."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from mooncake_cli.commands import common as c
from mooncake_cli.config import load
from mooncake_cli.output import Out
from mooncake_cli.registry import Registry
from mooncake_cli.worker.config import WorkerConfig

MODEL = typer.Option(None, "--model", metavar="DIR|demo",
                     help="Checkpoint directory (config.json, *.safetensors, tokenizer.json) of "
                          "a Llama, Mistral or Qwen2 model, or a built-in demo with random "
                          "weights (demo, demo-25m) [default: demo].")
DEVICE = typer.Option(None, "--device", help="cpu, cuda or cuda:N [default: cpu].")
DTYPE = typer.Option(None, "--dtype", help="float32, bfloat16 or float16 [default: float32].")
STORE = typer.Option(None, "--store", metavar="MASTER|none",
                     help="HOST:PORT of the store master (or etcd://... of an HA store), or "
                          "none [default: none].")
SEGMENT = typer.Option(None, "--segment-size",
                       help="DRAM this worker contributes to the store, e.g. 1GiB; 0 for none "
                            "[default: 256MiB].")
LISTEN = typer.Option(None, "--listen", metavar="HOST:PORT",
                      help="HTTP address; port 0 picks a free one [default: 127.0.0.1:0].")
ADVERTISE = typer.Option(None, "--advertise", metavar="HOST",
                         help="Host the conductor and other workers reach this one at "
                              "[default: the --listen host; this host's name for 0.0.0.0].")
BLOCK = typer.Option(None, "--block-size", metavar="TOKENS",
                     help="Tokens per KV block [default: 16].")
BLOCKS = typer.Option(None, "--kv-blocks", metavar="N",
                      help="Blocks in the paged KV cache [default: 512].")
CHUNK = typer.Option(None, "--chunk-size", metavar="TOKENS",
                     help="Prompt tokens computed per prefill step [default: 512].")
CONDUCTOR = typer.Option(None, "--conductor", metavar="URL",
                         help="http://HOST:PORT of a conductor to register with, or "
                              "etcd://HOST:PORT[/CLUSTER] to register in etcd for conductors "
                              "started with --registry [default: none].")
NAME = typer.Option(None, "--name", metavar="NAME",
                    help="Instance name [default: <role>@<listen address>].")
if TYPE_CHECKING:
    from mooncake_cli.worker.runtime import WorkerRuntime

HEARTBEAT = typer.Option(None, "--heartbeat", metavar="SECONDS",
                         help="Seconds between registrations with the conductor [default: 1].")


def _serve(out: Out, role: str, **flags: Any) -> None:
    cfg = load(WorkerConfig, role, out.config_file, role=role, **flags)
    tcfg = c.transfer_config(out)
    from mooncake_cli.worker.decode import DecodeWorker
    from mooncake_cli.worker.prefill import PrefillWorker

    kind: type[WorkerRuntime] = PrefillWorker if role == "prefill" else DecodeWorker
    with c.stop_signals() as stop:
        worker = kind(cfg, tcfg, Registry.from_env())
        try:
            worker.start()
            info = worker.describe()
            out.event(info, f"{role} worker [bold]{escape(worker.name)}[/bold] at "
                            f"[bold]{escape(worker.url)}[/bold]\n"
                            f"  model: {escape(worker.model.description)}\n"
                            f"  KV: {cfg.kv_blocks} blocks of {cfg.block_size} tokens, "
                            f"segment {escape(info['segment'])}, store "
                            f"{escape(info['store'] or 'none')}\nCtrl-C to stop.")
            c.wait_for_signal(stop)
            out.event({"event": "stopping", "name": worker.name},
                      "stopping: finishing in-flight requests")
        finally:
            worker.close()
    out.event({"event": "stopped", "name": worker.name},
              "stopped; deregistered, store segment unmounted")


def prefill(ctx: typer.Context, model: str = MODEL, device: str = DEVICE, dtype: str = DTYPE,
            store: str = STORE, segment_size: str = SEGMENT, listen: str = LISTEN,
            advertise: str = ADVERTISE, block_size: int = BLOCK, kv_blocks: int = BLOCKS,
            chunk_size: int = CHUNK,
            conductor: str = CONDUCTOR, name: str = NAME, heartbeat: float = HEARTBEAT) -> None:
    """Serve prefill: reuse stored prefix blocks, compute the rest in chunks, store new blocks
    and stream the KV to a decode worker (POST /v1/prefill)."""
    _serve(ctx.obj, "prefill", model=model, device=device, dtype=dtype, store=store,
           segment_size=segment_size, listen=listen, advertise=advertise,
           block_size=block_size,
           kv_blocks=kv_blocks, chunk_size=chunk_size, conductor=conductor, name=name,
           heartbeat=heartbeat)


def decode(ctx: typer.Context, model: str = MODEL, device: str = DEVICE, dtype: str = DTYPE,
           store: str = STORE, segment_size: str = SEGMENT, listen: str = LISTEN,
           advertise: str = ADVERTISE, block_size: int = BLOCK, kv_blocks: int = BLOCKS,
           chunk_size: int = CHUNK,
           conductor: str = CONDUCTOR, name: str = NAME, heartbeat: float = HEARTBEAT) -> None:
    """Serve decode: KV reservations filled by prefill workers, continuous batching, tokens
    streamed as server-sent events (POST /v1/kv/reserve, /v1/generate, /v1/kv/release).
    With --store it contributes --segment-size of DRAM to the store's pool."""
    _serve(ctx.obj, "decode", model=model, device=device, dtype=dtype, store=store,
           segment_size=segment_size, listen=listen, advertise=advertise,
           block_size=block_size,
           kv_blocks=kv_blocks, chunk_size=chunk_size, conductor=conductor, name=name,
           heartbeat=heartbeat)
