"""`--link-bandwidth model`: the conductor estimates every fetch at the cost model's bandwidth
and learns nothing from what fetches took (the always-fetch baseline of
scripts/fetch_replay_testbed.py); `measured`, the default, learns each pair's."""

from __future__ import annotations

import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.links import Links
from mooncake_cli.scheduler.scheduler import Scheduler, make_policy
from tests.integration.test_conductor_links import GBIT, small_cluster


def test_a_link_not_learned_keeps_the_models_bandwidth_and_fetches_over_it() -> None:
    c, req = small_cluster()
    c.links = Links(learn=False)
    c.by_name["holder"].busy_until = 100.0  # its queue rules it out
    c.by_name["near"].busy_until = 100.0  # only the far one is left
    c.links.observe("holder", "far", int(0.1 * GBIT), 1.0)  # 100 Mbit, dropped
    assert not c.links and c.links.get("holder", "far") is None and c.links.to_dict() == []
    d = Scheduler(c, make_policy("kvcache-centric")).schedule(req, 0.0)
    assert d.prefill == "far" and d.placement.chosen.fetch_blocks == 8  # the model's 10 Gbit
    assert d.placement.chosen.weighed is not None
    assert d.placement.chosen.weighed.measured is False
    assert d.placement.chosen.weighed.bandwidth == c.model.bandwidth


@pytest.mark.parametrize("setting,learns", [("measured", True), ("model", False)])
def test_the_conductor_learns_links_only_when_measured(setting: str, learns: bool) -> None:
    cfg = ConductorConfig(port=0) if setting == "measured" else \
        ConductorConfig(port=0, link_bandwidth=setting)  # measured: the default
    svc = ConductorService(cfg).start()
    try:
        links = svc.conductor.scheduler.cluster.links
        links.observe("a", "b", 1000, 1.0)
        assert links.get("a", "b") == (1000.0 if learns else None)
    finally:
        svc.close()


def test_an_unknown_link_bandwidth_is_refused() -> None:
    with pytest.raises(ConfigError, match="link_bandwidth must be measured or model"):
        ConductorConfig(link_bandwidth="fixed")
