"""The client behind trusted proxies (router.forwarding), as the new-streams limit sees it."""

from __future__ import annotations

import re

import pytest

from asrpool.router import forwarding, settings, throttling

LB = "10.0.0.5"


def xff(*values: str) -> list[tuple[bytes, bytes]]:
    return [(b"X-Forwarded-For", value.encode()) for value in values]


def test_a_trusted_proxy_names_the_client_and_a_stranger_names_nobody() -> None:
    proxies = forwarding.TrustedProxies("10.0.0.0/8, 192.168.1.1")
    assert proxies.client(LB, xff("203.0.113.7")) == "203.0.113.7"
    assert proxies.client("198.51.100.2", xff("203.0.113.7")) == "198.51.100.2"  # not trusted
    assert proxies.client(LB, []) == LB


def test_the_client_is_the_right_most_hop_no_trusted_proxy_added() -> None:
    """A client that writes its own X-Forwarded-For cannot pass for someone else: the
    proxy appends the address it saw, and that one counts."""
    proxies = forwarding.TrustedProxies("10.0.0.0/8")
    assert proxies.client(LB, xff("6.6.6.6, 203.0.113.7, 10.1.2.3")) == "203.0.113.7"
    assert proxies.client(LB, xff("6.6.6.6", "203.0.113.7")) == "203.0.113.7"
    assert proxies.client(LB, xff("10.1.1.1, 10.2.2.2")) == "10.1.1.1"  # all proxies


def test_nothing_is_trusted_by_default_and_star_trusts_all() -> None:
    assert forwarding.TrustedProxies("").client(LB, xff("203.0.113.7")) == LB
    # Every hop trusted: the left-most, the first a proxy saw.
    assert forwarding.TrustedProxies("*").client(LB, xff("203.0.113.7, 10.0.0.9")) == (
        "203.0.113.7")


def test_a_garbage_hop_is_bounded_and_counts_as_a_client() -> None:
    proxies = forwarding.TrustedProxies("10.0.0.0/8")
    assert proxies.client(LB, xff("x" * 500)) == "x" * forwarding.MAX_ADDRESS_CHARS


def test_each_client_behind_the_proxy_has_its_own_budget() -> None:
    now = [0.0]
    gate = throttling.NewStreams(1.0, 2.0, clock=lambda: now[0],
                                 proxies=forwarding.TrustedProxies(LB))
    for _ in range(2):
        assert gate.new_stream(LB, xff("203.0.113.7")) is None
    refused = gate.new_stream(LB, xff("203.0.113.7"))
    assert refused is not None and "203.0.113.7" in refused.message
    assert gate.new_stream(LB, xff("203.0.113.8")) is None  # another client, another budget
    unproxied = throttling.NewStreams(1.0, 2.0, clock=lambda: now[0])
    assert [unproxied.new_stream(LB, xff(f"203.0.113.{i}")) is None for i in range(3)] == [
        True, True, False]  # without trust: one budget for all


def test_a_malformed_proxy_list_is_refused_naming_the_entry() -> None:
    with pytest.raises(ValueError, match=re.escape("not an address or network: '10.0.0.300'")):
        forwarding.TrustedProxies("10.0.0.1, 10.0.0.300")
    with pytest.raises(ValueError, match=re.escape("10.0.0.300")):
        settings.RouterSettings(forwarded_allow_ips="10.0.0.300")
