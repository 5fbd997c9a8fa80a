"""The relay's frame-header scanner: bytes pass unchanged whatever the read boundaries."""

from __future__ import annotations

import itertools
import os

from hypothesis import given
from hypothesis import strategies as st

from asrpool.router import frames

MASK = b"\x01\x02\x03\x04"


def client_stream() -> tuple[bytes, bytes]:
    """A client's flow with data, a ping and a pong; and what the pod must get."""
    audio = frames.frame(frames.BINARY, os.urandom(9600), MASK)
    small = frames.frame(frames.BINARY, b"x" * 40, MASK)
    fragments = (
        bytes([0x02, 0x80 | 3]) + MASK + frames.unmask(b"abc", MASK)  # not final
        + bytes([0x80, 0x80 | 2]) + MASK + frames.unmask(b"de", MASK)  # final continuation
    )
    ping = frames.frame(frames.PING, b"hi", MASK)
    pong = frames.frame(frames.PONG, b"yo", MASK)
    flow = audio + pong + small + ping + fragments + audio
    return flow, audio + small + ping + fragments + audio


def feed_in(scanner: frames.Scanner, data: bytes, cuts: list[int]) -> list[frames.Scan]:
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    return [scanner.feed(data[a:b]) for a, b in itertools.pairwise(bounds)]


@given(st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12))
def test_bytes_pass_unchanged_whatever_the_reads(cuts: list[int]) -> None:
    flow, expected = client_stream()
    scanner = frames.Scanner(True, 1 << 20, frozenset({frames.CLOSE, frames.PONG}))
    scans = feed_in(scanner, flow, cuts)
    assert b"".join(s.forward for s in scans) == expected
    assert [c for s in scans for c in s.controls] == [frames.Control(frames.PONG, b"yo")]
    assert all(s.fault is frames.Fault.NONE for s in scans)
    assert scanner.messages == 4 and scanner.at_boundary


def test_a_message_over_the_limit_is_refused_from_its_header() -> None:
    scanner = frames.Scanner(True, 1000, frozenset())
    ok = frames.frame(frames.BINARY, b"x" * 10, MASK)
    big = frames.frame(frames.BINARY, b"y" * 1001, MASK)
    scan = scanner.feed(ok + big[:8])  # the header only: the payload has not come
    assert scan.fault is frames.Fault.TOO_LARGE and scan.size == 1001
    assert scan.forward == ok


@given(st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12))
def test_a_refused_frames_payload_is_discarded_and_the_close_behind_it_found(
        cuts: list[int]) -> None:
    """The rest of a refused client's bytes, read on by a discarding scanner: its refused
    frame's payload and what follows pass (to be dropped), and its close is found."""
    scanner = frames.Scanner(True, 1000, frozenset({frames.CLOSE, frames.PONG}))
    ok = frames.frame(frames.BINARY, b"x" * 10, MASK)
    big = frames.frame(frames.BINARY, b"y" * 5000, MASK)
    close = frames.close_frame(1000, mask=MASK)
    scan = scanner.feed(ok + big[:9])
    assert scan.fault is frames.Fault.TOO_LARGE and scan.rest == big[:9]
    flow = scanner.discarding()
    scans = feed_in(flow, scan.rest + big[9:] + ok + close, cuts)
    assert [c.opcode for s in scans for c in s.controls] == [frames.CLOSE]
    assert all(s.fault is frames.Fault.NONE for s in scans)


def test_fragments_count_towards_the_limit() -> None:
    scanner = frames.Scanner(True, 100, frozenset())
    head = bytes([0x02, 0x80 | 60]) + MASK + b"z" * 60
    cont = bytes([0x80, 0x80 | 60]) + MASK + b"z" * 60
    assert scanner.feed(head).fault is frames.Fault.NONE
    scan = scanner.feed(cont)
    assert scan.fault is frames.Fault.TOO_LARGE and scan.size == 120


def test_frames_a_server_must_refuse() -> None:
    unmasked = frames.frame(frames.BINARY, b"x")
    rsv = bytes([0x80 | 0x40 | frames.BINARY, 0x80 | 1]) + MASK + b"x"
    opcode = bytes([0x80 | 0x3, 0x80 | 1]) + MASK + b"x"
    stray_continuation = bytes([0x80, 0x80 | 1]) + MASK + b"x"
    long_ping = frames.frame(frames.PING, b"p" * 126, MASK)
    for bad in (unmasked, rsv, opcode, stray_continuation, long_ping, b"garbage!" * 4):
        scanner = frames.Scanner(True, 1 << 20, frozenset())
        assert scanner.feed(bad).fault is frames.Fault.PROTOCOL, bad


def test_the_pods_pings_and_close_are_cut_out_and_read() -> None:
    scanner = frames.Scanner(False, 1 << 20, frozenset({frames.CLOSE, frames.PING}))
    word = frames.frame(frames.BINARY, b"w" * 40)
    flow = word + frames.frame(frames.PING, b"1234") + word + frames.close_frame(1001, "bye")
    scan = scanner.feed(flow)
    assert scan.forward == word + word
    assert [c.opcode for c in scan.controls] == [frames.PING, frames.CLOSE]
    assert frames.close_code(scan.controls[1].payload) == (1001, "bye")
    assert frames.close_code(b"") == (1005, "")


def test_mid_frame_is_not_a_boundary() -> None:
    scanner = frames.Scanner(False, 1 << 20, frozenset())
    word = frames.frame(frames.BINARY, b"w" * 400)
    scanner.feed(word[:100])
    assert not scanner.at_boundary
    scanner.feed(word[100:])
    assert scanner.at_boundary



def fragments(*sizes: int) -> list[bytes]:
    """The masked frames of a fragmented binary message, fragments of these sizes."""
    last = len(sizes) - 1
    return [fragment(frames.BINARY if i == 0 else frames.CONT, b"f" * size, i == last)
            for i, size in enumerate(sizes)]


def fragment(opcode: int, payload: bytes, fin: bool) -> bytes:
    framed = frames.frame(opcode, payload, MASK)
    return framed if fin else bytes([framed[0] & 0x7F]) + framed[1:]


def until_fault(scanner: frames.Scanner, data: bytes, cuts: list[int]) -> list[frames.Scan]:
    scans = []
    for scan in feed_in(scanner, data, cuts):
        scans.append(scan)
        if scan.fault is not frames.Fault.NONE:
            break
    return scans


@given(st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12))
def test_a_fragmented_message_is_refused_at_the_fragment_that_passes_the_limit(
        cuts: list[int]) -> None:
    """Fragments count together and control frames between them do not: a message of
    exactly the limit passes; the next is refused from the header of the fragment that
    takes it over, with the size up to that fragment, its first fragments passed on."""
    scanner = frames.Scanner(True, 1000, frozenset({frames.PONG}))
    whole, over = fragments(400, 400, 200), fragments(400, 400, 300)
    ping = frames.frame(frames.PING, b"p" * 100, MASK)
    pong = frames.frame(frames.PONG, b"q" * 100, MASK)
    flow = whole[0] + ping + whole[1] + whole[2] + pong + b"".join(over)
    scans = until_fault(scanner, flow, cuts)
    assert (scans[-1].fault, scans[-1].size) == (frames.Fault.TOO_LARGE, 1100)
    assert b"".join(s.forward for s in scans) == (
        whole[0] + ping + whole[1] + whole[2] + over[0] + over[1])
    assert len(scans[-1].rest) >= 8 and over[2].startswith(scans[-1].rest)  # its header on
    assert scanner.fragmented and scanner.messages == 1  # the relay must end the message


def test_each_message_counts_from_zero() -> None:
    scanner = frames.Scanner(True, 1000, frozenset())
    flow = b"".join([*fragments(600, 400), frames.frame(frames.BINARY, b"x" * 1000, MASK),
                     *fragments(1, 999)])
    scan = scanner.feed(flow)
    assert (scan.fault, scan.forward, scanner.messages) == (frames.Fault.NONE, flow, 3)
    assert not scanner.fragmented and scanner.at_boundary


def test_a_first_fragment_over_the_limit_is_refused_alone() -> None:
    scanner = frames.Scanner(True, 1000, frozenset())
    ok = frames.frame(frames.BINARY, b"x" * 10, MASK)
    scan = scanner.feed(ok + fragments(1001, 10)[0])
    assert (scan.fault, scan.size, scan.forward) == (frames.Fault.TOO_LARGE, 1001, ok)
    assert not scanner.fragmented  # the relay tells the pod with a message of its own


@given(st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12))
def test_a_refused_fragmented_messages_rest_is_discarded_and_the_close_found(
        cuts: list[int]) -> None:
    """Its remaining fragments (control frames between them) are read by a discarding
    scanner as the continuations they are, never a fault, and the close behind found."""
    scanner = frames.Scanner(True, 1000, frozenset({frames.CLOSE, frames.PONG}))
    over = fragments(400, 400, 300, 5000, 0)
    ping = frames.frame(frames.PING, b"p", MASK)
    scan = scanner.feed(b"".join(over[:2]) + over[2][:8])
    assert scan.fault is frames.Fault.TOO_LARGE
    rest = scan.rest + over[2][8:] + over[3] + ping + over[4] + frames.close_frame(1000, mask=MASK)
    scans = feed_in(scanner.discarding(), rest, cuts)
    assert [c.opcode for s in scans for c in s.controls] == [frames.CLOSE]
    assert all(s.fault is frames.Fault.NONE for s in scans)
