"""What a pod's websocket layer costs per message: the part ``bench capacity`` leaves out.

``bench capacity`` counts the pod's host work from a message's bytes onwards. Getting
those bytes off the socket, and a result's bytes onto it, is the event loop's work too.
This measures it alone: a real uvicorn with the pod's protocols and options
(``limits.uvicorn_options``: ``framing.WebSocketProtocol``, no permessage-deflate) in a
child process, whose app receives ``count`` messages of the given bytes and then sends
``count`` messages of the reply's bytes as the pod's handler does (starlette's
``WebSocket``, the reader's idle watch), against a real ``websockets`` client in this
process. The figures are the server process's CPU time per
message in each direction (``time.process_time``: the time the machine gave the client
is not counted).

``asrpool bench sockets`` measures both ways of waiting for a message (:data:`READERS`)
side by side, alternating, for the message of each input kind of ``bench capacity``,
and writes ``sockets.json``: per message and per stream-step (the kind's messages per
80 ms step), each reader's median over the rounds and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from multiprocessing import queues
from pathlib import Path
from typing import Any

from websockets.sync import client as ws_client

from asrpool.common import processes

KINDS = ("pcm-80ms", "pcm-1s", "opus", "opus-20ms")  # the messages of bench/intake.py
REPLY_BYTES = 60  # a Step or Word result, as bench capacity's pod sends them

_START_TIMEOUT_S = 30.0
# How the server waits for each message: as the pod's reader does (one idle timer per
# connection, ``server.idleness``), or as it did before it (each receive under a timeout
# of its own, ``asyncio.wait``), kept to measure the two side by side.
READERS = ("idle-watch", "deadline-per-message")


def socket_costs(message_bytes: int, reply_bytes: int, count: int = 5000,
                 reader: str = READERS[0]) -> dict[str, float]:
    """Server CPU in us per binary message received (``message_bytes`` long) and per
    message sent (``reply_bytes``); their content is nothing to the websocket layer.
    ``reader``: how the server waits for each message (:data:`READERS`)."""
    if reader not in READERS:
        raise ValueError(f"unknown reader {reader!r}: one of {', '.join(READERS)}")
    message, reply = os.urandom(message_bytes), os.urandom(reply_bytes)
    context = multiprocessing.get_context("spawn")
    results: queues.Queue[Any] = context.Queue()
    port = processes.free_port()
    server = context.Process(target=_serve, args=(port, count, reply, results, reader),
                             daemon=True)
    server.start()
    try:
        with _connect(port) as websocket:
            for _ in range(count):
                websocket.send(message)
            for _ in range(count):
                websocket.recv()
        received_s, sent_s = results.get(timeout=_START_TIMEOUT_S)
    finally:
        server.join(5)
        if server.is_alive():
            server.kill()
            server.join()
    return {"receive_us": round(received_s * 1e6 / count, 2),
            "send_us": round(sent_s * 1e6 / count, 2),
            "message_bytes": message_bytes, "reply_bytes": reply_bytes, "messages": count,
            "reader": reader}


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


def _serve(port: int, count: int, reply: bytes, results: queues.Queue[Any],
           reader: str) -> None:
    """The child: one websocket, ``count`` messages in, ``count`` replies out."""
    import uvicorn
    from starlette import websockets

    from asrpool.common import limits
    from asrpool.server import idleness

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        ws = websockets.WebSocket(scope, receive, send)
        await ws.accept()
        started = time.process_time()
        if reader == "idle-watch":
            idle = idleness.IdleWatch(120.0, lambda: False)  # as the pod's reader keeps it
            for _ in range(count):
                idle.waiting = True
                try:
                    await ws.receive()
                finally:
                    idle.waiting = False
                idle.active()
            idle.close()
        else:
            for _ in range(count):
                await _receive_by_its_deadline(ws, 120.0)
        received = time.process_time() - started
        started = time.process_time()
        for _ in range(count):
            await ws.send_bytes(reply)
        results.put((received, time.process_time() - started))
        await ws.receive()  # the client's close
        server.should_exit = True

    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                            log_level="warning", **limits.uvicorn_options(limits.Limits()))
    server = uvicorn.Server(config)
    asyncio.run(server.serve())


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
    """Both readers on ``kind``'s message, alternating, ``rounds`` times."""
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
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = [compare(kind, opts.count, opts.rounds) for kind in kinds]
    result = {"benchmark": "sockets", "readers": list(READERS), "count": opts.count,
              "rounds": opts.rounds, "reply_bytes": REPLY_BYTES, "cpus": os.cpu_count(),
              "load_average_at_end": os.getloadavg(),
              "elapsed_s": round(time.monotonic() - started, 1), "rows": rows}
    (out / "sockets.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {out / 'sockets.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
