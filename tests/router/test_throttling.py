"""The router's new-streams limit is the router's: its workers each enforce a share."""

from __future__ import annotations

from asrpool.router import settings, throttling, wiring


def _admitted(gate: throttling.NewStreams, now: list[float], seconds: int) -> int:
    """New streams one address gets from asking ten times a second for ``seconds``
    (its last ask at ``seconds - 0.1``)."""
    got = 0
    for tick in range(seconds * 10):
        now[0] = tick / 10
        got += gate.new_stream("203.0.113.7") is None
    return got


def test_a_worker_enforces_its_share_and_names_the_whole_rate() -> None:
    now = [0.0]
    whole = throttling.NewStreams(4.0, 8.0, clock=lambda: now[0])
    assert _admitted(whole, now, 10) == int(8 + 4 * 9.9)  # the burst, then the rate

    now = [0.0]
    quarter = throttling.NewStreams(4.0, 8.0, clock=lambda: now[0], share=0.25)
    assert _admitted(quarter, now, 10) == int(2 + 1 * 9.9)
    refused = quarter.new_stream("203.0.113.7")
    assert refused is not None
    assert refused.message.startswith("too_many_streams: over 4 new streams per second from")


def test_a_share_keeps_a_burst_of_one() -> None:
    now = [0.0]
    gate = throttling.NewStreams(1.0, 2.0, clock=lambda: now[0], share=0.1)
    assert gate.new_stream("203.0.113.7") is None
    assert gate.of_key("k") is None
    assert gate.of_key("k") is not None


def test_each_worker_of_a_router_gets_one_share() -> None:
    config = settings.RouterSettings(workers=4, new_streams_per_second=40, new_streams_burst=8)
    gate = wiring.build(config).new_streams  # a burst of 8 / 4 workers
    assert [gate.new_stream("203.0.113.7") is None for _ in range(3)] == [True, True, False]
