"""``bench/sockets.py``: a real uvicorn with the pod's websocket protocol, a real client;
the server's CPU per message each way."""

from __future__ import annotations

from asrpool.bench import sockets


def test_socket_costs_are_measured_both_ways_and_grow_with_the_message() -> None:
    small = sockets.socket_costs(100, 80, count=2000)
    assert small["messages"] == 2000 and small["message_bytes"] == 100
    assert small["receive_us"] > 0 and small["send_us"] > 0
    large = sockets.socket_costs(1 << 20, 80, count=200)  # a MiB each: copied, unmasked
    assert large["receive_us"] > small["receive_us"]
