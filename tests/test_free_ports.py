"""``processes.free_port``: a port nothing listens on, outside the kernel's ephemeral
range (where outgoing connections take their source ports) when there is room; and
``processes.port_answers``: whether a server listens on a port now."""

from __future__ import annotations

import socket

from asrpool.common import processes


def test_a_free_port_binds_and_lies_below_the_ephemeral_range() -> None:
    low = processes._ephemeral_low()
    for _ in range(20):
        port = processes.free_port()
        if low - processes.LOWEST_PORT >= 1000:
            assert processes.LOWEST_PORT <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((processes.LOOPBACK, port))  # nothing holds it


def test_a_port_in_use_is_not_handed_out() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((processes.LOOPBACK, processes.free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert not processes.port_is_free(taken)
        assert all(processes.free_port() != taken for _ in range(200))


def test_a_port_answers_while_something_listens_on_it() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((processes.LOOPBACK, processes.free_port()))
        port = held.getsockname()[1]
        assert not processes.port_answers(port)  # bound, not listening
        held.listen()
        assert processes.port_answers(port)
    assert not processes.port_answers(port)
