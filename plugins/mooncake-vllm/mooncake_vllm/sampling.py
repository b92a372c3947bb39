"""Between our messages and vLLM's: a request's SamplingParams (mooncake_cli.engine.sampling)
as vLLM's, with the `kv_transfer_params` of vLLM's disaggregation protocol, and vLLM's outputs
as the token events a decode worker streams (mooncake_cli.api.roles: TokenEvent, FinalEvent).
"""

from __future__ import annotations

from typing import Any

from mooncake_cli.engine.sampling import SamplingParams


def vllm_params(p: SamplingParams, max_tokens: int, kv: dict[str, Any],
                prefill: bool = False) -> Any:
    """vLLM's SamplingParams for `p`, streaming deltas. `prefill`: the first token only, which
    vLLM must end by length (what keeps the prompt's blocks for the decode worker), so neither
    an end-of-sequence token nor a stop string ends it."""
    from vllm import SamplingParams as VllmParams
    from vllm.sampling_params import RequestOutputKind

    return VllmParams(
        max_tokens=max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
        seed=p.seed, stop=None if prefill else list(p.stop) or None,
        stop_token_ids=None if prefill else list(p.stop_token_ids) or None,
        ignore_eos=prefill or p.ignore_eos, output_kind=RequestOutputKind.DELTA,
        extra_args={"kv_transfer_params": kv})


def token_events(out: Any) -> list[dict[str, Any]]:
    """The token events of one delta output: its text goes with its last token (vLLM holds
    text back while it ends inside a character)."""
    c = out.outputs[0]
    events: list[dict[str, Any]] = [{"token": int(t), "text": ""} for t in c.token_ids]
    if events:
        events[-1]["text"] = c.text
    return events


def final_event(out: Any, completion_tokens: int) -> dict[str, Any]:
    """The final event of a finished output; an aborted request ends as an error (the
    conductor then moves it to another decode worker)."""
    reason = out.outputs[0].finish_reason
    if reason in (None, "abort", "error"):
        return {"finish_reason": "error", "completion_tokens": completion_tokens,
                "error": f"vLLM ended the request: {reason or 'no finish reason'}"}
    return {"finish_reason": reason, "completion_tokens": completion_tokens}
