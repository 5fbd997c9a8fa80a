"""The catalogue of client behaviours the parity run plays against each server.

Each case is a real websocket client (``websockets``) or HTTP request speaking Kyutai's
protocol, and returns the server's answer as a dict of plain values: what a client
could see and depend on (message types and fields, bytes, close codes, HTTP status and
body). :mod:`asrpool_harness.bench.parity_reports` compares the answers field by field.

Audio is speech-like noise quantised to 16 bits, so that the WAV posted and the floats
streamed are the same samples. Clients send as fast as the server reads (both servers
buffer, and both process one frame per step whatever the pace), in the message
patterns of Kyutai's clients: 1920-sample ``Audio`` messages for speech, 24,000-sample
ones for silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import json
import urllib.error
import urllib.request
import wave
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from asrpool.bench import synthetic
from asrpool.common import audio, protocol
from asrpool_harness.bench.parity_servers import Target

FRAME = protocol.FRAME_SIZE
SECOND = protocol.SAMPLE_RATE
SESSION_TIMEOUT = 180.0  # one case on a loaded two-core machine
SPEECH_SECONDS = 4.0
INT16_SCALE = 32768
NO_CLOSE_FRAME = "no close frame (TCP dropped)"
# A frame over moshi-server's (and asrpool's) 16 MiB limit.
OVERSIZED_BYTES = protocol.DEFAULT_MAX_MESSAGE_BYTES + (1 << 20)

Frame = bytes | str  # a binary frame, or a text frame


def speech(seconds: float = SPEECH_SECONDS, seed: int = 5) -> NDArray[np.float32]:
    """Speech-like audio at 16 bits (as a WAV holds it), as float32."""
    samples = synthetic.speechlike(seconds, seed)
    quantised = np.clip(np.round(samples * INT16_SCALE), -INT16_SCALE, INT16_SCALE - 1)
    pcm: NDArray[np.float32] = (quantised / INT16_SCALE).astype(np.float32)
    return pcm


def wav_bytes(pcm: NDArray[np.float32]) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SECOND)
        wav.writeframes(np.round(pcm * INT16_SCALE).astype("<i2").tobytes())
    return out.getvalue()


def pack(message: dict[str, Any]) -> bytes:
    """A client message as Kyutai's Python clients pack it (floats as float32)."""
    body = dict(message)
    if body.get("type") == "Audio":
        body["pcm"] = np.asarray(body["pcm"], dtype=np.float32).tolist()
    packed: bytes = msgpack.packb(body, use_bin_type=True, use_single_float=True)
    return packed


def audio_frames(pcm: NDArray[np.float32], size: int = FRAME) -> list[bytes]:
    return [pack({"type": "Audio", "pcm": pcm[i:i + size]}) for i in range(0, len(pcm), size)]


def silence(seconds: float, size: int = FRAME) -> list[bytes]:
    return audio_frames(np.zeros(int(seconds * SECOND), dtype=np.float32), size)


def marker(marker_id: int) -> bytes:
    return pack({"type": "Marker", "id": marker_id})


# One websocket session.


@dataclasses.dataclass
class Session:
    """What a client saw: the binary frames, how the connection ended, and the upgrade."""

    frames: list[bytes] = dataclasses.field(default_factory=list)
    close: str = "open"
    extensions: str | None = None
    status: int | None = None  # an HTTP status instead of an upgrade
    body: str | None = None
    marker_at: int | None = None  # frames received before what ``then`` sent

    def messages_after(self) -> list[dict[str, Any]]:
        return self.messages()[self.marker_at or 0:]

    def messages(self) -> list[dict[str, Any]]:
        return [msgpack.unpackb(frame, raw=False) for frame in self.frames]

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        return [m for m in self.messages() if m.get("type") in types]


async def session(target: Target, sends: Iterable[Frame], *, until_marker: int | None = None,
                  then: Sequence[Frame] = (), headers: dict[str, str] | None = None,
                  query: str = "") -> Session:
    """Send ``sends`` while reading every frame, until the marker ``until_marker`` comes
    back or the server ends the connection; once the marker is back, send ``then`` and
    read until the server ends the connection (without ``then``: close).

    The client sends no pings of its own: a server holding a fast sender back
    (backpressure) reads none of its bytes for a while, pings included."""
    seen = Session()
    sent_headers = {protocol.API_KEY_HEADER: target.api_key} if headers is None else headers
    try:
        async with connect(target.ws_url + query, additional_headers=sent_headers,
                           max_size=None, open_timeout=SESSION_TIMEOUT,
                           ping_interval=None) as ws:
            if ws.response is not None:
                seen.extensions = ws.response.headers.get("Sec-WebSocket-Extensions")
            await asyncio.wait_for(_converse(ws, sends, until_marker, then, seen),
                                   SESSION_TIMEOUT)
    except InvalidStatus as exc:
        seen.status = exc.response.status_code
        seen.body = exc.response.body.decode(errors="replace") if exc.response.body else ""
    return seen


async def _converse(ws: ClientConnection, sends: Iterable[Frame], until_marker: int | None,
                    then: Sequence[Frame], seen: Session) -> None:
    writer = asyncio.create_task(_send_all(ws, sends))
    try:
        marker_back = await _read(ws, until_marker, seen)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    if marker_back and then:
        seen.marker_at = len(seen.frames)
        await _send_all(ws, then)
        await _read(ws, None, seen)
    elif marker_back:
        seen.close = "closed by the client"


async def _send_all(ws: ClientConnection, sends: Iterable[Frame]) -> None:
    for frame in sends:
        try:
            await ws.send(frame)
        except ConnectionClosed:
            return


async def _read(ws: ClientConnection, until_marker: int | None, seen: Session) -> bool:
    """Read until the marker (True) or the end of the connection (False)."""
    try:
        async for frame in ws:
            if isinstance(frame, str):
                continue
            seen.frames.append(frame)
            message = msgpack.unpackb(frame, raw=False)
            if message.get("type") == "Marker" and message.get("id") == until_marker:
                return True
    except ConnectionClosed:
        pass
    seen.close = close_of(ws)
    return False


def close_of(ws: ClientConnection) -> str:
    received = ws.protocol.close_rcvd
    if received is None:
        return NO_CLOSE_FRAME
    return f"close {received.code}"


# What the answers are made of.


def words(messages: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """Word and EndWord messages as [type, text or time, start time]."""
    found: list[list[Any]] = []
    for m in messages:
        if m.get("type") == "Word":
            found.append(["Word", m.get("text"), m.get("start_time")])
        elif m.get("type") == "EndWord":
            found.append(["EndWord", m.get("stop_time")])
    return found


def steps_before_markers(messages: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """[marker id, Step messages before it] for each Marker."""
    found: list[list[Any]] = []
    steps = 0
    for m in messages:
        if m.get("type") == "Step":
            steps += 1
        elif m.get("type") == "Marker":
            found.append([m.get("id"), steps])
    return found


def float_width(frame: bytes) -> int | None:
    """32 or 64 when every float in ``frame`` is packed that wide (None: neither)."""
    message = msgpack.unpackb(frame, raw=False)
    for width, single in ((32, True), (64, False)):
        if msgpack.packb(message, use_bin_type=True, use_single_float=single) == frame:
            return width
    return None


def type_sequence(messages: Sequence[dict[str, Any]], skip: str = "Step") -> list[str]:
    return [str(m.get("type")) for m in messages if m.get("type") != skip]


def error_of(messages: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    errors = [m for m in messages if m.get("type") == "Error"]
    return errors[-1] if errors else None


# The cases. Each takes the target and returns its answer.


async def ready_bytes(target: Target) -> dict[str, Any]:
    seen = await session(target, [marker(1), *silence(1.0)], until_marker=1)
    return {"first_frame_hex": seen.frames[0].hex() if seen.frames else None,
            "extensions": seen.extensions}


def file_client_messages() -> list[dict[str, Any]]:
    """Kyutai's file client: asrpool's own schedule of it (``kyutai_file_messages``)."""
    return list(audio.kyutai_file_messages(speech(), 0))


async def file_client(target: Target) -> dict[str, Any]:
    seen = await session(target, [pack(m) for m in file_client_messages()], until_marker=0)
    messages = seen.messages()
    return {"words": words(messages), "markers": steps_before_markers(messages),
            "types": sorted(set(type_sequence(messages, skip=""))), "close": seen.close}


async def steps(target: Target) -> Session:
    return await session(target, [*audio_frames(speech(2.0)), marker(0), *silence(1.0)],
                         until_marker=0)


async def step_shape(target: Target) -> dict[str, Any]:
    seen = await steps(target)
    frames = [f for f in seen.frames if msgpack.unpackb(f, raw=False).get("type") == "Step"]
    first = msgpack.unpackb(frames[0], raw=False) if frames else {}
    return {"fields": list(first), "prs_count": len(first.get("prs", [])),
            "float_bits": sorted({float_width(f) for f in frames}, key=str),
            "step_idx_type": type(first.get("step_idx")).__name__,
            "buffered_pcm_type": type(first.get("buffered_pcm")).__name__,
            "steps": len(frames)}


async def step_counters(target: Target) -> dict[str, Any]:
    messages = (await steps(target)).of_type("Step")
    indices = [m["step_idx"] for m in messages]
    return {"first_step_idx": indices[0] if indices else None,
            "step_idx_increments": sorted({b - a for a, b in itertools.pairwise(indices)}),
            "buffered_pcm_first": [m["buffered_pcm"] for m in messages[:3]]}


def speech_first_messages() -> list[dict[str, Any]]:
    second = np.zeros(SECOND, dtype=np.float32)
    return [{"type": "Audio", "pcm": speech(seed=7)}, {"type": "Audio", "pcm": second},
            {"type": "Marker", "id": 0}, {"type": "Audio", "pcm": second}]


async def speech_first(target: Target) -> dict[str, Any]:
    """Speech from the first sample (no leading silence)."""
    sends = [*audio_frames(speech(seed=7)), *silence(1.0), marker(0), *silence(1.0)]
    messages = (await session(target, sends, until_marker=0)).messages()
    return {"words": words(messages)}


async def markers(target: Target) -> dict[str, Any]:
    pcm = speech(seed=9)
    sends: list[Frame] = [*silence(1.0, SECOND)]
    for i, start in enumerate(range(0, len(pcm), SECOND)):
        sends += [*audio_frames(pcm[start:start + SECOND]), marker(i + 1)]
    sends += [*silence(5.0, SECOND), marker(99), *silence(5.0, SECOND)]
    messages = (await session(target, sends, until_marker=99)).messages()
    return {"markers": steps_before_markers(messages), "words": words(messages)}


async def init_mid_stream(target: Target) -> dict[str, Any]:
    sends = [*silence(1.0, SECOND), *audio_frames(speech(2.0, seed=11)), pack({"type": "Init"}),
             *audio_frames(speech(2.0, seed=12)), *silence(1.0), marker(0), *silence(1.0)]
    messages = (await session(target, sends, until_marker=0)).messages()
    return {"sequence": type_sequence(messages), "words": words(messages),
            "markers": steps_before_markers(messages)}


async def text_frame(target: Target) -> dict[str, Any]:
    sends: list[Frame] = [*audio_frames(speech(2.0)), "hello", *silence(1.0), marker(0),
                          *silence(1.0)]
    seen = await session(target, sends, until_marker=0)
    return {"words": words(seen.messages()), "close": seen.close}


async def _bad_frame(target: Target, bad: Frame) -> dict[str, Any]:
    """Speech and a marker; once the marker is back (every result of the speech out),
    ``bad``: what comes after it, and how the connection ends."""
    sends = [*audio_frames(speech(2.0)), *silence(1.0), marker(0), *silence(1.0)]
    seen = await session(target, sends, until_marker=0, then=[bad])
    after = seen.messages_after()
    error = error_of(after)
    return {"words": words(seen.messages()[:seen.marker_at]),
            # Words of the silence after the marker may come too, as many as were stepped.
            "after": [t for t in type_sequence(after) if t not in ("Word", "EndWord")],
            "error": sorted(error) if error else None, "close": seen.close}


async def _bad_frame_behind_audio(target: Target, bad: Frame) -> dict[str, Any]:
    """Speech, a second of silence (its words out) and ``bad`` at once: which results
    of the audio received before the bad frame still come back."""
    sends = [*audio_frames(speech(2.0)), *silence(1.0), bad]
    seen = await session(target, sends)
    messages = seen.messages()
    error = error_of(messages)
    # Whether results came back, not which: the words differ by the first frame's padding.
    return {"results_back": bool(words(messages)), "error": sorted(error) if error else None,
            "close": seen.close}


UNKNOWN_TYPE = msgpack.packb({"type": "Hello"})
MALFORMED = b"\xc1\x00"  # 0xc1: never used in MessagePack
OVERSIZED = bytes(OVERSIZED_BYTES)


async def unknown_type(target: Target) -> dict[str, Any]:
    return await _bad_frame(target, UNKNOWN_TYPE)


async def malformed_msgpack(target: Target) -> dict[str, Any]:
    return await _bad_frame(target, MALFORMED)


async def oversized_frame(target: Target) -> dict[str, Any]:
    return await _bad_frame(target, OVERSIZED)


async def unknown_type_behind_audio(target: Target) -> dict[str, Any]:
    return await _bad_frame_behind_audio(target, UNKNOWN_TYPE)


async def oversized_frame_behind_audio(target: Target) -> dict[str, Any]:
    return await _bad_frame_behind_audio(target, OVERSIZED)


async def _refused(target: Target, headers: dict[str, str]) -> dict[str, Any]:
    seen = await session(target, [], headers=headers)
    return {"status": seen.status, "body": seen.body}


async def no_key(target: Target) -> dict[str, Any]:
    return await _refused(target, {})


async def bad_key(target: Target) -> dict[str, Any]:
    return await _refused(target, {protocol.API_KEY_HEADER: target.api_key + "-wrong"})


async def query_key(target: Target) -> dict[str, Any]:
    seen = await session(target, [marker(1), *silence(1.0)], until_marker=1, headers={},
                         query=f"?{protocol.API_KEY_QUERY}={target.api_key}")
    return {"status": seen.status, "types": sorted(set(type_sequence(seen.messages())))}


async def full_server(target: Target, slots: int) -> dict[str, Any]:
    """``slots`` clients hold every slot; one more connects."""
    headers = {protocol.API_KEY_HEADER: target.api_key}
    holders = [await connect(target.ws_url, additional_headers=headers) for _ in range(slots)]
    try:
        for ws in holders:
            await asyncio.wait_for(ws.recv(), SESSION_TIMEOUT)  # Ready: the slot is taken
        seen = await session(target, [])
    finally:
        for ws in holders:
            await ws.close()
    return {"status": seen.status, "messages": seen.messages(), "close": seen.close}


RESUME_GRACE_SECONDS = 30.0  # asrpool's default: how long a dropped stream's slot is kept
FREE_SLOT_WAIT = 90.0  # for the next client to get the slot
RETRY_SECONDS = 0.25


async def clean_close_after_marker(target: Target, slots: int) -> dict[str, Any]:
    """Kyutai's file client closes as soon as its marker is back, while the server
    still holds the silence sent to flush the marker; every other slot is held: how
    soon the next client gets the slot (``seconds_until_free``, from the marker)."""
    headers = {protocol.API_KEY_HEADER: target.api_key}
    holders = [await connect(target.ws_url, additional_headers=headers) for _ in range(slots - 1)]
    try:
        for ws in holders:
            await asyncio.wait_for(ws.recv(), SESSION_TIMEOUT)  # Ready: the slot is taken
        seconds = await _closed_after_marker_then_next(target, headers)
    finally:
        for ws in holders:
            await ws.close()
    return {"next_client": "Ready" if seconds is not None else "no slot",
            "freed_before_resume_grace": seconds is not None and seconds < RESUME_GRACE_SECONDS,
            "seconds_until_free": None if seconds is None else round(seconds, 1)}


async def _closed_after_marker_then_next(target: Target, headers: dict[str, str]
                                         ) -> float | None:
    """Seconds from the marker's return to the next client's Ready (None: never)."""
    sends = [pack(m) for m in file_client_messages()]
    async with connect(target.ws_url, additional_headers=headers, max_size=None,
                       open_timeout=SESSION_TIMEOUT, ping_interval=None) as ws:
        await asyncio.wait_for(_converse(ws, sends, 0, (), Session()), SESSION_TIMEOUT)
        back = asyncio.get_running_loop().time()
        closing = asyncio.create_task(ws.close())  # waits for the server's answer
        freed = await _next_client_gets_a_slot(target, headers)
        await closing
    return asyncio.get_running_loop().time() - back if freed else None


async def _next_client_gets_a_slot(target: Target, headers: dict[str, str]) -> bool:
    """Connect again and again until a Ready (True) or ``FREE_SLOT_WAIT`` (False)."""
    deadline = asyncio.get_running_loop().time() + FREE_SLOT_WAIT
    while asyncio.get_running_loop().time() < deadline:
        async with connect(target.ws_url, additional_headers=headers,
                           open_timeout=SESSION_TIMEOUT) as ws:
            with contextlib.suppress(ConnectionClosed):
                first = msgpack.unpackb(await asyncio.wait_for(ws.recv(), SESSION_TIMEOUT))
                if first.get("type") == "Ready":
                    return True
        await asyncio.sleep(RETRY_SECONDS)
    return False


def post_wav(target: Target) -> dict[str, Any]:
    request = urllib.request.Request(
        target.http_url + protocol.STREAMING_PATH, data=wav_bytes(speech(seed=13)),
        headers={protocol.API_KEY_HEADER: target.api_key, "Content-Type": "audio/wav"})
    try:
        with urllib.request.urlopen(request, timeout=SESSION_TIMEOUT) as answer:
            status, body = answer.status, answer.read()
            content_type = answer.headers.get("Content-Type")
    except urllib.error.HTTPError as exc:
        status, body, content_type = exc.code, exc.read(), exc.headers.get("Content-Type")
    return {"status": status, "content_type": content_type, "body": _json_or_text(body)}


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def modules_info(target: Target) -> dict[str, Any]:
    modules = target.modules_info()
    return {"count": len(modules), "fields": sorted({k for m in modules for k in m}),
            "type": sorted({m.get("type") for m in modules}, key=str),
            "total_slots": sorted({m.get("total_slots") for m in modules}, key=str)}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    description: str
    run: Callable[[Target], Awaitable[dict[str, Any]]]


def _threaded(blocking: Callable[[Target], dict[str, Any]]
              ) -> Callable[[Target], Awaitable[dict[str, Any]]]:
    async def run(target: Target) -> dict[str, Any]:
        return await asyncio.to_thread(blocking, target)
    return run


def catalogue(slots: int) -> list[Case]:
    """Every case, in the order they run (each on an idle server)."""
    async def full(target: Target) -> dict[str, Any]:
        return await full_server(target, slots)

    async def closes(target: Target) -> dict[str, Any]:
        return await clean_close_after_marker(target, slots)

    return [
        Case("Ready", "the first frame's bytes; extensions the upgrade negotiated", ready_bytes),
        Case("file client", "a file as Kyutai's file client streams it: words, times, marker",
             file_client),
        Case("Step shape", "Step messages' fields, prs count and float width", step_shape),
        Case("Step counters", "step_idx and buffered_pcm values", step_counters),
        Case("speech first", "speech from the first sample, no leading silence", speech_first),
        Case("markers", "a marker after each second of speech: when each comes back",
             markers),
        Case("Init mid-stream", "Init between two utterances: Ready, words, times",
             init_mid_stream),
        Case("POST a WAV", "POST /api/asr-streaming with a 16-bit WAV",
             _threaded(post_wav)),
        Case("full server", f"{slots} clients hold every slot, one more connects", full),
        Case("clean close after marker", "Kyutai's file client closes once its marker is"
             " back, the server still holding its flush silence, every other slot held: the"
             " next client gets the slot", closes),
        Case("text frame", "a text frame mid-stream (ignored)", text_frame),
        Case("unknown type", "once the speech's results are out, {type: Hello}", unknown_type),
        Case("malformed MessagePack", "once the speech's results are out, bytes that are no"
             " MessagePack", malformed_msgpack),
        Case("17 MiB frame", "once the speech's results are out, one 17 MiB binary frame",
             oversized_frame),
        Case("unknown type behind audio", "speech and {type: Hello} at once: the results"
             " of the speech", unknown_type_behind_audio),
        Case("17 MiB frame behind audio", "speech and a 17 MiB frame at once: the results"
             " of the speech", oversized_frame_behind_audio),
        Case("no API key", "upgrade without kyutai-api-key", no_key),
        Case("bad API key", "upgrade with a wrong kyutai-api-key", bad_key),
        Case("key in the query", "auth_id instead of the header", query_key),
        Case("modules_info", "GET /api/modules_info", _threaded(modules_info)),
    ]


async def run_case(case: Case, target: Target) -> dict[str, Any]:
    """One case on an idle server; a failure is an answer too."""
    await asyncio.to_thread(target.wait_idle)
    try:
        return await case.run(target)
    except Exception as exc:  # the report shows what broke, and the run goes on
        return {"failed": f"{type(exc).__name__}: {exc}"}
