"""Parsing a testbed's links (no namespaces made): rates, per-end MTUs and their errors."""

from __future__ import annotations

import pytest

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.testbed.state import Testbed
from mooncake_cli.testbed.topology import Link, parse_links


def test_mtu_of_both_ends_of_each_end_and_the_default() -> None:
    links = parse_links("a-b=1gbit/mtu=1500:1400,b-c/mtu=9000,a-c=100mbit", ["a", "b", "c"])
    assert links == [Link(0, "a", "b", 10**9, 1500, 1400), Link(1, "b", "c", 10**10, 9000, 9000),
                     Link(2, "a", "c", 10**8, 1500, 1500)]
    assert (links[0].mtu("a"), links[0].mtu("b")) == (1500, 1400)
    bed = Testbed("mctt", ["a", "b", "c"], links)
    assert [(x["peer"], x["mtu"]) for x in bed.addresses("b")] == [("a", 1400), ("c", 9000)]


def test_a_record_without_mtus_reads_as_1500() -> None:
    bed = Testbed.from_dict({"prefix": "mctt", "hosts": ["a", "b"],
                             "links": [{"index": 0, "a": "a", "b": "b", "rate_bps": 10**9}]})
    assert bed.links[0].mtu("b") == 1500


@pytest.mark.parametrize(("links", "error"), [
    ("a-b=1gbit/mtu=500", "MTU 500 in link 'a-b=1gbit/mtu=500' is outside 576-65535"),
    ("a-b=1gbit/mtu=1500:70000", "MTU 70000 in link 'a-b=1gbit/mtu=1500:70000' is outside "
                                 "576-65535"),
    ("a-b=1gbit/mtu=1:2:3", "bad MTU in link 'a-b=1gbit/mtu=1:2:3': write /mtu=N or /mtu=N:M "
                            "(x's end, y's end)"),
    ("a-b=1gbit/mtu=big", "bad MTU in link 'a-b=1gbit/mtu=big': write /mtu=N or /mtu=N:M "
                          "(x's end, y's end)"),
    ("a-b=1gbit/size=1400", "bad link 'a-b=1gbit/size=1400': after the rate only /mtu=N or "
                            "/mtu=N:M"),
])
def test_bad_mtus_are_named(links: str, error: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_links(links, ["a", "b"])
    assert str(e.value) == error
