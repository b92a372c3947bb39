"""The live conductor's side of pipelined prefills (kvcache-pipeline): what the lead is told,
and what a lead's report changes (metrics; a stage that no longer answers is marked dead)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from mooncake_cli.api import roles
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.scheduler.estimate import Candidate

log = logging.getLogger(__name__)
Alive = Callable[[str, str, str], Awaitable[bool]]  # (name, url, why) -> still answers /health


class Pipelines:
    def __init__(self, instances: Instances, metrics: ConductorMetrics, alive: Alive) -> None:
        self.instances, self.metrics, self.alive = instances, metrics, alive

    def request(self, chosen: Candidate) -> roles.Pipeline | None:
        """The stages of a pipelined placement as the lead is told them; None when it runs
        alone (not pipelined, or a stage left the registry meanwhile)."""
        if not chosen.stages:
            return None
        try:
            urls = [self.instances.url(name) for name in chosen.stages]
        except KeyError:
            return None
        return roles.Pipeline(stages=urls, chunk_tokens=chosen.chunk_tokens)

    async def done(self, request: str, chosen: Candidate,
                   report: roles.PipelineReport | None) -> None:
        """Count a pipelined prefill; when its lead ran it alone, a stage that no longer
        answers /health is marked dead (a busy one is not)."""
        if report is None or not chosen.stages:
            return
        if not report.fallback:
            self.metrics.add("pipelined_total")
            return
        self.metrics.add("pipeline_fallbacks_total")
        log.info("pipelined prefill %s ran alone: %s", request, report.fallback)
        for name in chosen.stages:
            try:
                url = self.instances.url(name)
            except KeyError:
                continue
            await self.alive(name, url, f"pipeline stage failed: {report.fallback}")
