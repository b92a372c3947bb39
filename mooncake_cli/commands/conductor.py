"""`mooncake conductor start`: the global scheduler behind an OpenAI-compatible API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from mooncake_cli.commands import common as c
from mooncake_cli.config import help_of, load
from mooncake_cli.config.conductor import PIPELINE, ConductorConfig
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out


def _opt(flag: str, name: str, metavar: str | None = None) -> Any:
    """The typer option of ConductorConfig field `name`: its help is the field's description."""
    return typer.Option(None, flag, metavar=metavar, help=help_of(ConductorConfig, name))


app = typer.Typer(no_args_is_help=True, help="The conductor: KVCache-centric global scheduler "
                                             "behind an OpenAI-compatible API.")


@app.command()
def start(
    ctx: typer.Context,
    config: str = typer.Option(None, "--config", metavar="FILE",
                               help="cluster.toml; its [conductor] table sets every option "
                                    "below (flags win) [default: the global --config]."),
    host: str = _opt("--host", "host"),
    port: int = _opt("--port", "port"),
    model: str = _opt("--model", "model"),
    served_model_name: str = _opt("--served-model-name", "served_model_name"),
    block_size: int = _opt("--block-size", "block_size"),
    dtype: str = _opt("--dtype", "dtype"),
    policy: str = _opt("--policy", "policy"),
    link_bandwidth: str = _opt("--link-bandwidth", "link_bandwidth", "measured|model"),
    max_stages: int = _opt("--max-stages", "max_stages", "N"),
    pipeline_chunk: int = _opt("--pipeline-chunk", "pipeline_chunk", "TOKENS"),
    pipeline_min_gain: float = _opt("--pipeline-min-gain", "pipeline_min_gain", "FRACTION"),
    prefill: str = _opt("--prefill", "prefill"),
    decode: str = _opt("--decode", "decode"),
    registry: str = _opt("--registry", "registry", "etcd://HOST:PORT[/CLUSTER]"),
    peers: str = _opt("--peers", "peers", "etcd://HOST:PORT[/CLUSTER]"),
    peer_ttl: int = _opt("--peer-ttl", "peer_ttl", "SECONDS"),
    store_events: str = _opt("--store-events", "store_events", "ENDPOINT"),
    store_events_replay: str = _opt("--store-events-replay", "store_events_replay", "ENDPOINT"),
    ttft_slo: float = _opt("--ttft-slo", "ttft_slo"),
    tbt_slo: float = _opt("--tbt-slo", "tbt_slo"),
    max_queue: int = _opt("--max-queue", "max_queue", "N"),
    prefill_depth: int = _opt("--prefill-depth", "prefill_depth", "N"),
    request_timeout: float = _opt("--request-timeout", "request_timeout", "SECONDS"),
    max_migrations: int = _opt("--max-migrations", "max_migrations", "N"),
    prefetch: bool = typer.Option(None, "--prefetch/--no-prefetch",
                                  help=help_of(ConductorConfig, "prefetch")),
    profile: str = _opt("--profile", "profile"),
    explain: str = _opt("--explain", "explain", "FILE"),
    seed: int = _opt("--seed", "seed"),
    local: str = typer.Option(None, "--local", metavar="P,D",
                              help="Also start, in this process, a store master, P prefill "
                                   "and D decode workers of --model: a whole cluster."),
    kv_blocks: int = typer.Option(None, "--kv-blocks",
                                  help="With --local: KV cache blocks per worker "
                                       "[default: 512]."),
    engine: str = typer.Option(None, "--engine", metavar="native|vllm",
                               help="With --local: the workers' engine, native (ours) or "
                                    "vllm (vLLM's async engine in this process: needs the "
                                    "mooncake-vllm plugin and vLLM; on a CPU a --block-size "
                                    "that is a multiple of 32) [default: native]."),
    kv_wire: str = typer.Option(None, "--kv-wire", metavar="native|int8",
                                help="With --local: the workers' --kv-wire [default: native]."),
    secret: str = typer.Option(None, "--secret", envvar="MOONCAKE_SECRET", show_envvar=True,
                               help="Cluster secret the workers' and the conductor's internal "
                                    "endpoints require (signed requests); required beyond "
                                    "loopback. With --local: none makes a fresh one."),
    secret_file: str = c.SECRET_FILE,
    api_key: str = _opt("--api-key", "api_key", "KEY"),
    audit_log: str = _opt("--audit-log", "audit_log", "FILE"),
) -> None:
    """Serve the OpenAI API and route each request to the best prefill/decode pair."""
    from mooncake_cli.conductor.service import ConductorService
    from mooncake_cli.config.worker import WorkerConfig

    if TYPE_CHECKING:
        from mooncake_cli.conductor.local_cluster import LocalCluster

    out: Out = ctx.obj
    cfg = load(ConductorConfig, "conductor", config or out.config_file, host=host, port=port,
               model=model, served_model_name=served_model_name, block_size=block_size,
               dtype=dtype, policy=policy, link_bandwidth=link_bandwidth,
               max_stages=max_stages,
               pipeline_chunk=pipeline_chunk, pipeline_min_gain=pipeline_min_gain,
               prefill=prefill, decode=decode, registry=registry,
               peers=peers, peer_ttl=peer_ttl, request_timeout=request_timeout,
               store_events=store_events, store_events_replay=store_events_replay,
               max_migrations=max_migrations, prefetch=prefetch,
               ttft_slo=ttft_slo, max_queue=max_queue, prefill_depth=prefill_depth,
               tbt_slo=tbt_slo, profile=profile, explain=explain, seed=seed, api_key=api_key,
               audit_log=audit_log)
    tcfg = c.cluster_config(out, secret, secret_file)
    if engine not in (None, "native") and cfg.policy == PIPELINE:
        raise ConfigError(f"--policy {PIPELINE} runs pipeline stages on our engine's prefill "
                          f"workers only; with --engine {engine} use kvcache-centric")
    if kv_wire is not None and not local:
        raise ConfigError("--kv-wire sets the --local workers' wire; give it to each worker")
    if engine is not None and not local:
        raise ConfigError("--engine chooses the engine of the --local workers; workers started "
                          "on their own take it themselves (mooncake prefill --engine vllm)")
    with c.stop_signals() as stop:
        svc: ConductorService | LocalCluster
        if local:  # workers in this process: the engine (torch) loads only here
            from mooncake_cli.conductor.local_cluster import LocalCluster, parse_local

            p, d = parse_local(local)
            worker = load(WorkerConfig, "prefill", config or out.config_file,
                          kv_blocks=kv_blocks, engine=engine, kv_wire=kv_wire)
            svc = LocalCluster(cfg, p, d, worker, tcfg,
                               progress=lambda text: out.event({"event": "started",
                                                                "what": text}, text))
            conductor = svc.conductor
            assert conductor is not None
        else:
            svc = conductor = ConductorService(cfg, tcfg.secret).start()
        try:
            name = conductor.conductor.model.name
            out.event({"event": "serving", "url": svc.url, "model": name,
                       "policy": cfg.policy, "auth": bool(tcfg.secret or local),
                       "api_key": bool(cfg.api_key)},
                      f"conductor serving {name} on {svc.url}/v1 (policy {cfg.policy})")
            c.wait_for_signal(stop)
        finally:
            svc.close()
    out.event({"event": "stopped"}, "conductor stopped")
