"""`mooncake conductor start`: the global scheduler behind an OpenAI-compatible API."""

from __future__ import annotations

import typer

from mooncake_cli.commands import common as c
from mooncake_cli.conductor.config import ConductorConfig
from mooncake_cli.config import load
from mooncake_cli.output import Out

app = typer.Typer(no_args_is_help=True, help="The conductor: KVCache-centric global scheduler "
                                             "behind an OpenAI-compatible API.")


@app.command()
def start(
    ctx: typer.Context,
    config: str = typer.Option(None, "--config", metavar="FILE",
                               help="cluster.toml; its [conductor] table sets every option "
                                    "below (flags win) [default: the global --config]."),
    host: str = typer.Option(None, "--host", help="Listen address [default: 127.0.0.1]."),
    port: int = typer.Option(None, "--port", help="HTTP port (0: any free) [default: 8000]."),
    model: str = typer.Option(None, "--model",
                              help="Checkpoint directory or demo name, for the tokenizer and "
                                   "the KV block geometry [default: demo]."),
    served_model_name: str = typer.Option(None, "--served-model-name",
                                          help="The model name clients send [default: the "
                                               "model's id]."),
    block_size: int = typer.Option(None, "--block-size",
                                   help="Tokens per KV block; must match the workers' "
                                        "[default: 16]."),
    dtype: str = typer.Option(None, "--dtype", help="The workers' KV dtype [default: float32]."),
    policy: str = typer.Option(None, "--policy",
                               help="random, round-robin, least-load, cache-aware or "
                                    "kvcache-centric (default); kvcache-pipeline is "
                                    "simulator only (`mooncake bench trace`)."),
    prefill: str = typer.Option(None, "--prefill",
                                help="Comma-separated prefill worker URLs (workers may also "
                                     "register themselves)."),
    decode: str = typer.Option(None, "--decode", help="Comma-separated decode worker URLs."),
    registry: str = typer.Option(None, "--registry", metavar="etcd://HOST:PORT[/CLUSTER]",
                                 help="Also serve the workers registered in this etcd "
                                      "(started with --conductor etcd://...)."),
    ttft_slo: float = typer.Option(None, "--ttft-slo",
                                   help="TTFT SLO in seconds; requests that cannot meet it get "
                                        "429 [default: 0, no limit]."),
    tbt_slo: float = typer.Option(None, "--tbt-slo",
                                  help="TBT SLO in seconds [default: 0, no limit]."),
    profile: str = typer.Option(None, "--profile",
                                help="profile.json from `mooncake bench profile` [default: "
                                     "learn the cost model from the workers' timings]."),
    explain: str = typer.Option(None, "--explain", metavar="FILE",
                                help="Append every scheduling decision with its estimates to "
                                     "this JSONL file."),
    seed: int = typer.Option(None, "--seed", help="Seed of the random policies [default: 0]."),
    local: str = typer.Option(None, "--local", metavar="P,D",
                              help="Also start, in this process, a store master, P prefill "
                                   "and D decode workers of --model: a whole cluster."),
    kv_blocks: int = typer.Option(None, "--kv-blocks",
                                  help="With --local: KV cache blocks per worker "
                                       "[default: 512]."),
) -> None:
    """Serve the OpenAI API and route each request to the best prefill/decode pair."""
    from mooncake_cli.conductor.local_cluster import LocalCluster, parse_local
    from mooncake_cli.conductor.service import ConductorService
    from mooncake_cli.worker.config import WorkerConfig

    out: Out = ctx.obj
    cfg = load(ConductorConfig, "conductor", config or out.config_file, host=host, port=port,
               model=model, served_model_name=served_model_name, block_size=block_size,
               dtype=dtype, policy=policy, prefill=prefill, decode=decode, registry=registry,
               ttft_slo=ttft_slo,
               tbt_slo=tbt_slo, profile=profile, explain=explain, seed=seed)
    with c.stop_signals() as stop:
        svc: ConductorService | LocalCluster
        if local:
            p, d = parse_local(local)
            worker = load(WorkerConfig, "prefill", config or out.config_file,
                          kv_blocks=kv_blocks)
            svc = LocalCluster(cfg, p, d, worker, c.transfer_config(out),
                               progress=lambda text: out.event({"event": "started",
                                                                "what": text}, text))
            conductor = svc.conductor
            assert conductor is not None
        else:
            svc = conductor = ConductorService(cfg).start()
        try:
            name = conductor.conductor.model.name
            out.event({"event": "serving", "url": svc.url, "model": name,
                       "policy": cfg.policy},
                      f"conductor serving {name} on {svc.url}/v1 (policy {cfg.policy})")
            c.wait_for_signal(stop)
        finally:
            svc.close()
    out.event({"event": "stopped"}, "conductor stopped")
