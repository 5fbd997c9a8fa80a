"""What a pod's websocket layer costs per message: the part ``bench capacity`` leaves out.

``bench capacity`` counts the pod's host work from a message's bytes onwards. Getting
those bytes off the socket, and a result's bytes onto it, is the event loop's work too.
This measures it alone: a real uvicorn with the pod's protocols and options
(``limits.uvicorn_options``: ``framing.WebSocketProtocol``, no permessage-deflate) in a
child process, on the loop the pod's ``server.run()`` picks (uvloop), whose app receives
messages of the given bytes and then sends messages of the reply's bytes as the pod's
handler does (starlette's ``WebSocket``, the reader's idle watch), against real
``websockets`` clients in this process on :data:`CONNECTIONS` connections, paced so that
each message arrives in a read of its own while several connections are ready at once
(:data:`PACE_S`). The figures are the server process's CPU time per message in each
direction (``time.process_time``: the time the machine gave the clients is not counted).

``asrpool bench sockets`` measures the pod's two ways of waiting for a message and the
handed-over path it could take (:data:`READERS`) side by side, alternating, for the
message of each input kind of ``bench capacity``, and writes ``sockets.json``: per message
and per stream-step (the kind's messages per 80 ms step), each reader's median over the
rounds and their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
import sys
import time
from multiprocessing import queues
from pathlib import Path
from typing import Any, cast

from websockets.speedups import apply_mask
from websockets.sync import client as ws_client

from asrpool.bench import reports
from asrpool.common import processes
from asrpool.router import frames

KINDS = ("pcm-80ms", "pcm-1s", "opus", "opus-20ms")  # the messages of bench/intake.py
REPLY_BYTES = 60  # a Step or Word result, as bench capacity's pod sends them

_START_TIMEOUT_S = 30.0
# How the server waits for each message: as the pod's reader does (one idle timer per
# connection, ``server.idleness``), or as it did before it (each receive under a timeout
# of its own, ``asyncio.wait``), kept to measure the two side by side.
# Or, ``handed-over``, as no pod does yet: the connection taken from uvicorn after the
# accept (``framing.WebSocketProtocol.hand_over``, as the router's relay takes it) and its
# frames parsed in the protocol's own callback, replies written at once: no task wakes for
# a message or a reply, no ASGI event is made. What a pod's lean path could cost.
READERS = ("idle-watch", "deadline-per-message", "handed-over")
# The client's connections, each sending one message per round, and the pause between
# rounds: each message reaches the server in a read of its own, as a real-time stream's
# do (one every 20 to 80 ms), while the server finds several connections ready at once,
# as a busy pod does. Sent back to back, many messages would share one read and its
# wake-up and cost less each than they do in a pod.
CONNECTIONS = 32
PACE_S = 2e-3


def socket_costs(message_bytes: int, reply_bytes: int, count: int = 5000,
                 reader: str = READERS[0], connections: int = CONNECTIONS) -> dict[str, Any]:
    """Server CPU in us per binary message received (``message_bytes`` long) and per
    message sent (``reply_bytes``); their content is nothing to the websocket layer.
    ``count`` messages each way in all, over ``connections``; ``reader``: how the server
    waits for each message (:data:`READERS`)."""
    if reader not in READERS:
        raise ValueError(f"unknown reader {reader!r}: one of {', '.join(READERS)}")
    per_connection = max(1, count // connections)
    message, reply = os.urandom(message_bytes), os.urandom(reply_bytes)
    context = multiprocessing.get_context("spawn")
    results: queues.Queue[Any] = context.Queue()
    port = processes.free_port()
    server = context.Process(
        target=_serve, args=(port, connections, per_connection, reply, results, reader),
        daemon=True)
    server.start()
    try:
        with contextlib.ExitStack() as stack:
            clients = [stack.enter_context(_connect(port)) for _ in range(connections)]
            for _ in range(per_connection):
                for client in clients:
                    client.send(message)
                time.sleep(PACE_S)
            for client in clients:
                for _ in range(per_connection):
                    client.recv()
        received_s, sent_s = results.get(timeout=_START_TIMEOUT_S)
    finally:
        server.join(5)
        if server.is_alive():
            server.kill()
            server.join()
    messages = per_connection * connections
    return {"receive_us": round(received_s * 1e6 / messages, 2),
            "send_us": round(sent_s * 1e6 / messages, 2),
            "message_bytes": message_bytes, "reply_bytes": reply_bytes, "messages": messages,
            "connections": connections, "reader": reader}


def _connect(port: int) -> ws_client.ClientConnection:
    """The child's server, once it listens."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            return ws_client.connect(f"ws://127.0.0.1:{port}/", compression=None,
                                     max_size=None, open_timeout=_START_TIMEOUT_S)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class _Phases:
    """The child's clock: CPU from the last accept to the last message received, then
    to the last reply sent (handshakes are not counted)."""

    PHASES = ("accepted", "received", "sent")

    def __init__(self, connections: int) -> None:
        self.connections = connections
        self.marks: list[float] = []
        self._counts = dict.fromkeys(self.PHASES, 0)
        self._all_past = {phase: asyncio.Event() for phase in self.PHASES}

    async def reach(self, phase: str) -> bool:
        """This connection is past ``phase``; waits for every other one to be. Whether
        it was the last."""
        self._counts[phase] += 1
        last = self._counts[phase] == self.connections
        if last:
            self.marks.append(time.process_time())
            self._all_past[phase].set()
        await self._all_past[phase].wait()
        return last

    def finished(self) -> bool:
        return self._all_past["sent"].is_set()


def _serve(port: int, connections: int, count: int, reply: bytes,
           results: queues.Queue[Any], reader: str) -> None:
    """The child: ``connections`` websockets, ``count`` messages in on each, then
    ``count`` replies out on each."""
    import uvicorn
    from starlette import websockets

    from asrpool.common import limits
    from asrpool.server import idleness

    phases = _Phases(connections)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        ws = websockets.WebSocket(scope, receive, send)
        await ws.accept()
        if reader == "handed-over":
            if await _handed_over(scope, count, reply, phases):
                accepted, received, sent = phases.marks
                results.put((received - accepted, sent - received))
            if phases.finished():
                server.should_exit = True
            return
        await phases.reach("accepted")
        if reader == "idle-watch":
            idle = idleness.IdleWatch(120.0, lambda: False)  # as the pod's reader keeps it
            for _ in range(count):
                await idle.receive(ws)
                idle.active()
            idle.close()
        else:
            for _ in range(count):
                await _receive_by_its_deadline(ws, 120.0)
        await phases.reach("received")
        for _ in range(count):
            await ws.send_bytes(reply)
        if await phases.reach("sent"):
            accepted, received, sent = phases.marks
            results.put((received - accepted, sent - received))
        await ws.receive()  # the client's close
        if phases.finished():
            server.should_exit = True

    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                            log_level="warning", **limits.uvicorn_options(limits.Limits()))
    server = uvicorn.Server(config)
    server.run()  # on the loop the pod's server.run() picks (uvloop where installed)


async def _handed_over(scope: dict[str, Any], count: int, reply: bytes,
                       phases: _Phases) -> bool:
    """The ``handed-over`` reader: taken over right after the accept (the client sends
    once it has its 101), ``count`` messages parsed by :class:`_RawFrames`, then ``count``
    replies written straight to the transport. Whether it was the last to send."""
    from asrpool.common import framing

    loop = asyncio.get_running_loop()
    transport = scope["extensions"][framing.HANDOVER]["protocol"].hand_over(lambda: None)
    raw = _RawFrames(transport, count, loop.create_future(), loop.create_future())
    transport.set_protocol(raw)
    await phases.reach("accepted")
    await raw.all_in
    await phases.reach("received")
    framed = frames.frame(frames.BINARY, reply)
    for _ in range(count):
        transport.write(framed)
    last = await phases.reach("sent")
    await raw.closed  # the client's close, answered
    return last


class _RawFrames(asyncio.Protocol):
    """A client's frames (RFC 6455 5.2) parsed as its bytes arrive and unmasked by
    websockets' C ``apply_mask``; a close is answered and ends the connection."""

    def __init__(self, transport: asyncio.BaseTransport, count: int,
                 all_in: asyncio.Future[None], closed: asyncio.Future[None]) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.left, self.all_in, self.closed = count, all_in, closed
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (taken := _take_frame(self.buffer)) is not None:
            opcode, payload = taken
            if opcode == frames.CLOSE:
                self.transport.write(frames.frame(frames.CLOSE, payload[:2]))
                self.transport.close()
                return
            self.left -= 1
            if self.left == 0:
                self.all_in.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def _take_frame(buffer: bytearray) -> tuple[int, bytes] | None:
    """The first whole masked frame's opcode and unmasked payload, cut from ``buffer``
    (its header read by the router's ``frames.header``)."""
    got = frames.header(buffer)
    if got is None:
        return None
    _, opcode, head, size, _ = got
    end = head + size
    if len(buffer) < end:
        return None
    payload = apply_mask(bytes(buffer[head:end]), bytes(buffer[head - 4:head]))
    del buffer[:end]
    return opcode, payload


async def _receive_by_its_deadline(ws: Any, seconds: float) -> Any:
    """A message, waited for under a timeout of its own (the pod's reader before
    ``server.idleness``)."""
    receiving = asyncio.ensure_future(ws.receive())
    try:
        await asyncio.wait({receiving}, timeout=seconds)
        return receiving.result()
    finally:
        receiving.cancel()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="asrpool bench sockets", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="input kinds whose messages are sent (bench/intake.py)")
    parser.add_argument("--count", type=int, default=5000, help="messages per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results")
    return parser.parse_args(argv)


def compare(kind: str, count: int, rounds: int) -> dict[str, Any]:
    """Every reader on ``kind``'s message, alternating, ``rounds`` times."""
    from asrpool.bench import intake

    made = intake.build(kind, 1, 4)
    made.close()
    runs: dict[str, list[dict[str, float]]] = {reader: [] for reader in READERS}
    for _ in range(rounds):
        for reader in READERS:
            runs[reader].append(socket_costs(made.message_bytes, REPLY_BYTES, count, reader))
    row: dict[str, Any] = {"input": kind, "message_bytes": made.message_bytes,
                           "messages_per_step": made.messages_per_step}
    for field in ("receive_us", "send_us"):
        medians = {reader: statistics.median(run[field] for run in runs[reader])
                   for reader in READERS}
        row[field] = {**{reader: round(value, 2) for reader, value in medians.items()},
                      "runs": {reader: [run[field] for run in runs[reader]]
                               for reader in READERS}}
    receive = row["receive_us"]
    row["receive_us_per_stream_step"] = {
        reader: round(receive[reader] * made.messages_per_step, 2) for reader in READERS}
    row["idle_watch_over_deadline"] = round(receive[READERS[0]] / receive[READERS[1]], 3)
    row["handed_over_over_idle_watch"] = {
        field: round(row[field]["handed-over"] / row[field]["idle-watch"], 3)
        for field in ("receive_us", "send_us")}
    return row


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    from asrpool.bench import intake

    kinds = opts.kinds.split(",")
    unknown = sorted(set(kinds) - set(intake.KINDS))
    if unknown or opts.count < 1 or opts.rounds < 1:
        print(f"unknown input kinds {unknown}: of {', '.join(intake.KINDS)}" if unknown
              else "--count and --rounds must be at least 1", file=sys.stderr)
        return 2
    started = time.monotonic()
    rows = [compare(kind, opts.count, opts.rounds) for kind in kinds]
    reports.write(Path(opts.out), "sockets.json", {
        "benchmark": "sockets", "readers": list(READERS), "count": opts.count,
        "rounds": opts.rounds, "reply_bytes": REPLY_BYTES, **reports.machine(started),
        "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
