"""Relaying an admitted stream's bytes between its client and its pod, as nginx does.

Both handshakes are done (the client's by uvicorn, handed over; the pod's by
:mod:`asrpool.router.links`), neither negotiated an extension, so a client's masked
frames are valid frames for the pod and the pod's frames valid for the client: each
read from one socket is written to the other as is. A :class:`frames.Scanner` per
direction follows the frame headers, so that the router still

- refuses a client message over ``max_bytes`` from a frame's header (a single frame,
  or the fragment that takes a fragmented message over it), and a frame a server must
  refuse (close 1002), before that frame reaches the pod; the pod is told of a message
  over the limit in the client's place (``protocol.router_refusal``: a message of its
  own, or the last fragment of a message whose first fragments it has), so that the
  results of the audio it has still reach the client before the ``Error``;
- sees each side's close frame (the stream's end, settled by the caller) and answers
  the pod's pings itself, never the client (hop-by-hop liveness, as before);
- pings its client every ``ping_interval_seconds`` and drops one from which nothing arrived
  within ``ping_timeout_seconds`` of a ping, unless the router is holding it back;
- puts a frame of its own (a ping, a pong, an ``Error``, a close) only at a frame
  boundary of the flow it joins;
- aborts a client that does not read: its write buffer over the high-water mark for
  ``send_timeout_seconds`` ends the stream (``TooSlow``), whatever else it sends.

Backpressure is TCP's: when one side's write buffer passes its high-water mark the
other side's socket stops being read until it drains. Nothing else is buffered.
"""

from __future__ import annotations

import asyncio
import collections
import os
from typing import Any

import msgpack

from asrpool.common import framing, protocol
from asrpool.router import dialects, frames, links, metrics, proxying, refusals, retiming

CLIENT_CLOSE_TIMEOUT_S = 10.0  # for the client's answer to our close, as uvicorn
# A pod's Error message (our pods encode its type first); the ones with these codes end
# a stream for the pod's own reasons, and the stream moves instead (router.moving).
ERROR_TYPE = b"\xa4type\xa5Error"
SHED_CLOSES = {str(protocol.ErrorCode.DRAINING): protocol.CloseCode.RESTART,
               str(protocol.ErrorCode.OVERLOADED): protocol.CloseCode.TRY_AGAIN}
# Markers remembered for a move, at most (a pod keeps fewer waiting: --max-pending-markers).
MAX_MARKERS = 1024
PAD_LIMIT_BYTES = 1 << 20  # the most filler sent to finish a cut frame


class _ClientSide(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.from_client(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.client_lost(exc)

    def pause_writing(self) -> None:
        self.relay.read_pod(False)
        self.relay.client_stalled(True)

    def resume_writing(self) -> None:
        self.relay.client_stalled(False)
        self.relay.read_pod(True)


def bad_frame(scan: frames.Scan, max_bytes: int) -> str:
    """What a pod sent that no pod may: the link is dropped, the stream told pod_lost."""
    if scan.fault is frames.Fault.TOO_LARGE:
        return f"the pod sent a message of {scan.size} bytes, over the {max_bytes}-byte limit"
    return "the pod sent a frame no server may send (masked, reserved bits or opcode, or a " \
        "control frame over 125 bytes)"


class Relay:
    def __init__(
        self,
        handover: framing.WebSocketProtocol,
        link: links.PodLink,
        max_bytes: int,
        meters: metrics.Metrics,
        ping: tuple[float, float],
        send_timeout_seconds: float,
        dialect: dialects.Dialect = dialects.KYUTAI,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.dialect = dialect
        self.client = handover.hand_over(self.shutdown)
        self.client_protocol, self.link = handover, link
        self.up = frames.Scanner(True, max_bytes, frozenset({frames.CLOSE, frames.PONG}))
        self.down = frames.Scanner(False, max_bytes, frozenset({frames.CLOSE, frames.PING}))
        self.to_pod: list[bytes] = []  # pongs waiting for a frame boundary
        self.to_client: list[bytes] = []  # pings waiting for one
        self.ended: asyncio.Future[proxying.End] = self.loop.create_future()
        self.client_gone = self.loop.create_future()
        self.client_paused = False
        self.max_bytes = max_bytes
        self.refused: refusals.Refusal | None = None  # told to the pod in the client's place
        self.client_flow = self.up  # a refused client's: self.up.discarding()
        self.ping_interval, self.ping_timeout = ping
        self.heard = False  # anything from the client since the last ping (a flag: uvloop's
        # clock has millisecond steps, a loopback pong can come within the same one)
        self.timer: asyncio.TimerHandle | None = None
        self.send_timeout_seconds = send_timeout_seconds
        self.stall_timer: asyncio.TimerHandle | None = None
        self.meters = meters.relayed
        self.counted = [0, 0]  # messages up and down already counted
        self.samples = 0  # of audio the client sent: the stream's clock (router.retiming)
        self.samples_before = 0  # of those, sent before this connection (a resume's)
        self.turn_seconds = 0.0  # of audio a realtime session's turns transcribed
        self.messages_before = 0  # sent to the client before this connection (a resume's)
        self.up.peek = self._peek
        # Markers the client sent that no pod has answered yet (by id, oldest first): a
        # moved stream's new pod is sent them again, so that none is lost.
        self.markers: collections.deque[int] = collections.deque(maxlen=MAX_MARKERS)
        self.down.peek = self._peek_pod
        self.moved: retiming.PodFrames | None = None  # a moved stream's new pod's flow
        self.moved_at = 0  # a moved stream's samples before its current pod
        self.cut_short = 0  # bytes of a client frame the lost pod got part of, to drop
        self._join(link)
        self.client.set_protocol(_ClientSide(self))

    def _join(self, link: links.PodLink) -> None:
        self.link = link
        link.at_boundary = lambda: self.up.at_boundary
        link.on_pause = lambda paused: self.read_client(not paused)
        link.on_lost = self.pod_lost

    def resumed(self, samples: int, messages: int, shift: int) -> None:
        """A resumed stream: its client had sent ``samples`` and been sent ``messages``;
        its pod's times are ``shift`` samples behind the stream's (it was moved there)."""
        self.samples, self.messages_before = samples, messages
        self.samples_before = samples
        if shift:
            self.moved, self.moved_at = retiming.PodFrames(self.max_bytes), shift

    def clock(self) -> tuple[int, int]:
        """The samples the client has sent, the messages (``Ready`` apart) it was sent."""
        return self.samples, self.messages_before + self.down.messages

    async def run(self, first: bytes, pod_gone: asyncio.Event,
                  then: bytes | None = None) -> proxying.End:
        """Forward the pod's first frame (and the router's own message ``then``), relay
        until one side ends, say how."""
        self.client.write(frames.frame(self.dialect.opcode, first))
        if then is not None:
            self.client.write(frames.frame(frames.BINARY, then))
        self.link.attach(self.from_pod)
        self._schedule_ping()
        return await self._until_ended(pod_gone)

    async def _until_ended(self, pod_gone: asyncio.Event) -> proxying.End:
        lapse = asyncio.ensure_future(pod_gone.wait())
        try:
            waited: list[asyncio.Future[Any]] = [self.ended, lapse]
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lapse.cancel()
        self.end(proxying.PodLost("the pod's heartbeat lapsed"))  # unless it ended already
        self._count()
        return self.ended.result()

    def movable(self) -> bool:
        """Whether the stream can go on on another pod: the client has every frame the
        lost pod sent whole, is inside no fragmented message, and is still there."""
        return (self.dialect.keeps_streams and self.down.at_boundary
                and not self.up.fragmented and self.refused is None
                and not self.client.is_closing() and not self.client_gone.done())

    async def run_moved(self, link: links.PodLink, pod_gone: asyncio.Event) -> proxying.End:
        """Go on relaying on ``link`` (a new pod, its ``Ready`` already read and not
        passed on), its times moved on by the steps the stream had taken; the rest of
        the client's frame the lost pod got part of is dropped."""
        self.moved_at, self.cut_short = self.samples, self.up.skip
        self.moved = retiming.PodFrames(self.max_bytes)
        fresh = frames.Scanner(False, self.max_bytes, self.down.cut)  # at a boundary for good
        fresh.messages, self.down = self.down.messages, fresh
        self.to_pod.clear()  # pongs owed to the lost pod
        self.ended = self.loop.create_future()
        self._join(link)
        link.attach(self.from_pod)
        for mid in self.markers:  # at a frame boundary: nothing was written to it yet
            marker = protocol.encode({"type": "Marker", "id": mid})
            link.write(frames.frame(frames.BINARY, marker, os.urandom(4)))
        self._schedule_ping()
        self.read_client(True)  # held back meanwhile: the lost pod's pause is no more
        return await self._until_ended(pod_gone)

    def end(self, end: proxying.End) -> None:
        """The first end wins; both sides stop being read (the caller settles them)."""
        if self.ended.done():
            return
        self.ended.set_result(end)
        if self.timer is not None:
            self.timer.cancel()
        self.client_stalled(False)
        for transport in (self.client, self.link.transport):
            if transport is not None and not transport.is_closing():
                transport.pause_reading()

    # client to pod

    def from_client(self, data: bytes) -> None:
        if self.ended.done():
            self._closing_client(data)
            return
        self.heard = True
        if self.refused is not None:
            self._discard_client(data)
            return
        scan = self.up.feed(data)
        forward = scan.forward
        if self.cut_short:  # the rest of a frame the lost pod had part of
            dropped = min(self.cut_short, len(forward))
            forward, self.cut_short = forward[dropped:], self.cut_short - dropped
        if forward:
            self.link.write(forward)
        if self.to_pod and self.up.at_boundary:
            self.link.write(b"".join(self.to_pod))
            self.to_pod.clear()
        for control in scan.controls:
            if control.opcode == frames.CLOSE:
                self._client_closed(control.payload)
                return
        if scan.fault is frames.Fault.TOO_LARGE:
            refusal = refusals.too_large(scan.size, self.max_bytes)
            self._refuse_through_pod(refusal, self.up.fragmented)
            self.client_flow = self.up.discarding()
            self._discard_client(scan.rest)
        elif scan.fault is frames.Fault.PROTOCOL:
            self.end(proxying.ClientLeft(protocol.CloseCode.PROTOCOL_ERROR))
            self.close_client(protocol.CloseCode.PROTOCOL_ERROR, "invalid frame")

    def _peek(self, data: bytes, start: int) -> None:
        samples = retiming.audio_samples(data, start)
        if samples:
            self.samples += samples
        elif (mid := retiming.marker_id(data, start)) is not None:
            self.markers.append(mid)

    def _peek_pod(self, data: bytes, start: int) -> None:
        if self.markers and data.startswith(retiming.MARKER_REPLY, start):
            self.markers.popleft()
        elif not self.dialect.keeps_streams:  # realtime: its usage, once per turn
            self.turn_seconds += dialects.turn_seconds(data, start)

    def _refuse_through_pod(self, refusal: refusals.Refusal, fragmented: bool) -> None:
        """A client message refused from a frame's header (that frame does not reach the
        pod): the pod is told in the client's place, so that it sends the results of the
        audio it has, then the ``Error`` and its close, all relayed; the stream ends with
        the pod's close, as for a bad message the pod refuses itself. A message whose
        first fragments were passed on is ended with the refusal as its last fragment
        (the pod drops the message for it). Meanwhile the client's bytes are read and
        dropped (:meth:`_discard_client`)."""
        self.refused = refusal
        opcode = frames.CONT if fragmented else frames.BINARY
        told = frames.frame(opcode, protocol.router_refusal(refusal), os.urandom(4))
        self.link.write(told)  # at a frame boundary: the refused frame was not passed on

    def _discard_client(self, data: bytes) -> None:
        """A refused client's bytes, its refused frame's payload first, are dropped
        (never buffered), but for its close and a frame a server must refuse."""
        scan = self.client_flow.feed(data)
        for control in scan.controls:
            if control.opcode == frames.CLOSE:
                self._client_closed(control.payload)
                return
        if scan.fault is frames.Fault.PROTOCOL:
            self.end(proxying.ClientLeft(protocol.CloseCode.PROTOCOL_ERROR))
            self.close_client(protocol.CloseCode.PROTOCOL_ERROR, "invalid frame")

    def _client_closed(self, payload: bytes) -> None:
        """The client's close: answer it (uvicorn did), then the stream ends."""
        code, _ = frames.close_code(payload)
        if self.down.at_boundary:
            self.client.write(frames.frame(frames.CLOSE, payload[:2]))
        self.client.close()
        self.end(proxying.ClientLeft(code))

    def _closing_client(self, data: bytes) -> None:
        scan = self.client_flow.feed(data)
        closed = any(c.opcode == frames.CLOSE for c in scan.controls)
        if closed or scan.fault is not frames.Fault.NONE:
            self.client.close()

    def client_lost(self, exc: Exception | None) -> None:
        # A refused stream is over: its client's drop is no loss to wait for a resume after.
        code = protocol.CloseCode.LOST if self.refused is None else protocol.CloseCode.NORMAL
        self.end(proxying.ClientLeft(code))
        if not self.client_gone.done():
            self.client_gone.set_result(None)
        self.client_protocol.connection_lost(exc)  # uvicorn forgets the connection

    def read_client(self, on: bool) -> None:
        self.client_paused = not on
        if not self.ended.done() and not self.client.is_closing():
            (self.client.resume_reading if on else self.client.pause_reading)()

    # pod to client

    def from_pod(self, data: bytes) -> None:
        if self.ended.done():
            return
        if self.moved is not None:
            self._from_new_pod(data)
            return
        if ERROR_TYPE in data and self.down.at_boundary and not self.down.held:
            shed = _shed_at(data)
            if shed is not None and self.movable():
                at, end = shed
                self._pass_from_pod(data[:at])
                self.end(end)
                return
        self._pass_from_pod(data)

    def _pass_from_pod(self, data: bytes) -> None:
        scan = self.down.feed(data)
        if scan.forward:
            self.client.write(scan.forward)
        if self.to_client and self.down.at_boundary:
            self.client.write(b"".join(self.to_client))
            self.to_client.clear()
        for control in scan.controls:
            if control.opcode == frames.PING:
                self._to_pod(frames.frame(frames.PONG, control.payload, os.urandom(4)))
            elif control.opcode == frames.CLOSE:
                self.end(proxying.PodClosed(*frames.close_code(control.payload)))
                return
        if scan.fault is not frames.Fault.NONE:  # refused from its header: never buffered
            self.end(proxying.PodLost(bad_frame(scan, self.max_bytes)))

    def _from_new_pod(self, data: bytes) -> None:
        """A moved stream's new pod: whole frames, each message on the stream's clock."""
        assert self.moved is not None
        got, fault = self.moved.feed(data)
        for opcode, payload in got:
            if opcode == frames.BINARY and (shed := _shed(payload)) and self.movable():
                self.end(proxying.PodShed(frames.frame(frames.BINARY, payload), *shed))
                return  # it moves again
            if opcode == frames.BINARY:
                if self.markers and payload.startswith(retiming.MARKER_REPLY):
                    self.markers.popleft()
                message = retiming.retimed(payload, self.moved_at)
                self.client.write(frames.frame(frames.BINARY, message))
                self.down.messages += 1
            elif opcode == frames.PING:
                self._to_pod(frames.frame(frames.PONG, payload, os.urandom(4)))
            elif opcode == frames.CLOSE:
                self.end(proxying.PodClosed(*frames.close_code(payload)))
                return
        if self.to_client:
            self.client.write(b"".join(self.to_client))
            self.to_client.clear()
        if fault:
            self.end(proxying.PodLost(fault))

    def client_stalled(self, stalled: bool) -> None:
        """The deadline on sends to the client: armed while its write buffer is over
        the high-water mark (the pod is not read meanwhile), disarmed once it drains."""
        if self.stall_timer is not None:
            self.stall_timer.cancel()
            self.stall_timer = None
        if stalled and not self.ended.done():
            self.stall_timer = self.loop.call_later(self.send_timeout_seconds, self._too_slow)

    def _too_slow(self) -> None:
        self.stall_timer = None
        self.end(proxying.TooSlow(self.send_timeout_seconds))
        self.client.abort()  # a close would wait for a buffer that never drains

    def finish_client_frame(self) -> None:
        """Complete the client's frame that its end cut short (a client aborted in the
        middle of one) with filler, so that the pod link can still be closed cleanly
        (the pod frees the slot at once; it refuses the garbled message or takes it).
        A large remainder is not worth sending: the link is then dropped."""
        if 0 < self.up.skip <= PAD_LIMIT_BYTES and self.link.transport is not None:
            self.link.write(bytes(self.up.skip))
            self.up.skip = 0

    def pod_lost(self) -> None:
        self.end(proxying.PodLost("the pod's connection was lost"))

    def read_pod(self, on: bool) -> None:
        transport = self.link.transport
        if not self.ended.done() and transport is not None and not transport.is_closing():
            (transport.resume_reading if on else transport.pause_reading)()

    def _to_pod(self, data: bytes) -> None:
        if self.up.at_boundary:
            self.link.write(data)
        else:
            self.to_pod.append(data)

    # liveness of the client

    def _schedule_ping(self) -> None:
        self.timer = self.loop.call_later(self.ping_interval, self._ping)

    def _ping(self) -> None:
        self.heard = False
        ping = frames.frame(frames.PING, os.urandom(4))
        if self.down.at_boundary:
            self.client.write(ping)
        else:
            self.to_client.append(ping)
        self.timer = self.loop.call_later(self.ping_timeout, self._check_alive)

    def _check_alive(self) -> None:
        self._count()
        if self.client_paused or self.heard:
            self._schedule_ping()
            return
        # As uvicorn's keepalive timeout: close 1011, and the stream ends as lost.
        self.end(proxying.ClientLeft(protocol.CloseCode.NO_STATUS))
        self.close_client(protocol.CloseCode.INTERNAL, "keepalive ping timeout")

    # telling the client at the end

    def tell_client(self, frame: bytes) -> bool:
        """Write a frame of the router's own, if the flow to the client allows one."""
        if self.client.is_closing() or not self.down.at_boundary:
            return False
        self.client.write(frame)
        return True

    def close_client(self, code: int, reason: str = "") -> None:
        """Send a close and wait a bound for the client's answer; without a frame
        boundary to put it at, drop the connection."""
        if not self.tell_client(frames.close_frame(code, reason)):
            self.client.abort()
            return
        # Then drop it: a close would wait for a write buffer that a client that does
        # not read never drains.
        self.loop.call_later(CLIENT_CLOSE_TIMEOUT_S, self.client.abort)
        self.client.resume_reading()

    def shutdown(self) -> None:
        """This router is shutting down (uvicorn's shutdown, after the drain's grace):
        the drain ``Error`` and close 1012, where the flow to the client has a frame
        boundary; the stream stays resumable."""
        self.end(proxying.ClientLeft(protocol.CloseCode.RESTART))
        told = refusals.router_shut_down() if self.dialect.keeps_streams else \
            refusals.router_draining()
        if self.tell_client(self.dialect.told(told)):
            self.tell_client(frames.close_frame(told.close_code))
        self.client.close()

    def abort_client(self) -> None:
        self.client.abort()

    def _count(self) -> None:
        """Messages relayed, into the metrics now and then (never per message)."""
        up, down = self.up.messages, self.down.messages
        self.meters.labels("up").inc(up - self.counted[0])
        self.meters.labels("down").inc(down - self.counted[1])
        self.counted = [up, down]


def _shed_at(data: bytes) -> tuple[int, proxying.PodShed] | None:
    """Where in ``data`` (a read that starts at a frame) the pod's Error that ends the
    stream for its own reasons begins, and that end; None when there is none whole."""
    pos = 0
    while (got := framing.header(data, pos)) is not None:
        _, opcode, head, size, _ = got
        payload = data[pos + head:pos + head + size]
        if len(payload) < size:
            return None
        if opcode == frames.BINARY and (shed := _shed(payload)):
            return pos, proxying.PodShed(data[pos:pos + head + size], *shed)
        pos += head + size
    return None


def _shed(payload: bytes) -> tuple[str, int] | None:
    """The code and close of a pod's Error that ends a stream for the pod's own reasons."""
    if payload[1:1 + len(ERROR_TYPE)] != ERROR_TYPE:
        return None
    try:
        code = msgpack.unpackb(payload, raw=False).get("code")
    except (ValueError, AttributeError, msgpack.UnpackException):
        return None
    close = SHED_CLOSES.get(code) if isinstance(code, str) else None
    return None if close is None else (code, close)
