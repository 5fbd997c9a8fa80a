"""The official ``openai`` SDK (``openai[realtime]``, pinned), unchanged, against a real pod
(``asrpool serve --model tiny``) at ``/v1/realtime?intent=transcription``: its events as
the SDK parses them, strictly, and the turn's transcript the words Kyutai's protocol
gives for the same audio on the same pod."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

from tests.support import kyutai_client, servers, streams

STRICT = TypeAdapter(RealtimeServerEvent)
H200 = Path(__file__).resolve().parents[2] / "bench/results/capacity-stt-1b-en_fr-cuda.json"
SESSION = {"type": "transcription", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None,
    "transcription": {"model": "tiny"}}}}


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.ServerProcess]:
    with servers.ServerProcess(tmp_path_factory.mktemp("realtime")) as server:
        server.wait_ready()
        yield server


def pcm16(seconds: float, seed: int) -> np.ndarray:
    """Speech-like audio as 16-bit samples, so that both protocols hear the same."""
    return (streams.random_speechlike(seconds, seed) * 32767).astype("<i2")


async def events_until(conn: Any, kind: str, timeout: float = 60.0) -> list[Any]:
    out = []
    async with asyncio.timeout(timeout):
        async for event in conn:
            out.append(event)
            if event.type == kind:
                return out
    raise AssertionError(f"the connection ended before {kind}: {[e.type for e in out]}")


def strictly(events: list[Any]) -> None:
    for event in events:
        STRICT.validate_python(event.model_dump(exclude_unset=True))


async def test_a_committed_turn_is_transcribed_as_kyutais_protocol_hears_it(
        pod: servers.ServerProcess) -> None:
    audio = pcm16(3.0, seed=21)
    client = openai.AsyncOpenAI(api_key="sk-local", base_url=f"{pod.http_url}/v1")
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        (created,) = await events_until(conn, "session.created", 10)
        await conn.session.update(session=SESSION)
        updated = await events_until(conn, "session.updated", 10)
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio.tobytes()).decode())
        await conn.input_audio_buffer.commit()
        turn = await events_until(conn, "conversation.item.input_audio_transcription.completed")
    strictly([created, *updated, *turn])
    kinds = [e.type for e in turn]
    assert kinds[:3] == ["input_audio_buffer.committed", "conversation.item.added",
                         "conversation.item.done"], kinds
    deltas = [e.delta for e in turn if e.type.endswith(".delta")]
    completed = turn[-1]
    assert completed.transcript == "".join(deltas)
    assert completed.item_id == turn[0].item_id
    assert completed.usage.seconds == round(len(audio) / 24_000, 3)
    # The same samples through Kyutai's protocol (the audio, a marker, silence): the same
    # words, up to its marker.
    heard = await kyutai_client.transcribe(pod.ws_url, audio.astype(np.float32) / 32768,
                                           short=True)
    words = [m["text"] for m in heard if m["type"] == "Word"]
    assert words, "the tiny model says words for this audio: a comparison, not two empties"
    assert completed.transcript == " ".join(words)


async def test_bad_events_are_errors_and_the_session_goes_on(
        pod: servers.ServerProcess) -> None:
    client = openai.AsyncOpenAI(api_key="sk-local", base_url=f"{pod.http_url}/v1")
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await events_until(conn, "session.created", 10)
        await conn.input_audio_buffer.commit(event_id="empty-commit")
        (error,) = await events_until(conn, "error", 10)
        assert error.error.code == "input_audio_buffer_commit_empty"
        assert error.error.event_id == "empty-commit"
        await conn.send({"type": "input_audio_buffer.append", "audio": "not base64!"})
        (error,) = await events_until(conn, "error", 10)
        assert (error.error.code, error.error.param) == ("invalid_value", "audio")
        await conn.input_audio_buffer.append(
            audio=base64.b64encode(pcm16(0.5, seed=3).tobytes()).decode())
        await conn.input_audio_buffer.commit()
        turn = await events_until(conn,
                                  "conversation.item.input_audio_transcription.completed")
        strictly([error, *turn])


async def test_a_full_pod_says_why_and_a_request_without_intent_is_refused(
        pod: servers.ServerProcess) -> None:
    client = openai.AsyncOpenAI(api_key="sk-local", base_url=f"{pod.http_url}/v1")
    holders = [await kyutai_client.connect(pod.ws_url) for _ in range(2)]  # both slots
    try:
        for ws in holders:
            await kyutai_client.expect(ws, "Ready")
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            (error,) = await events_until(conn, "error", 10)
            assert error.error.code == "busy"
    finally:
        for ws in holders:
            await ws.close()
    with pytest.raises(Exception, match="400"):
        async with client.realtime.connect() as conn:
            await conn.recv()


async def test_server_vad_turns_come_from_the_pause_head(tmp_path: Path) -> None:
    """The SDK with ``server_vad`` against a pod whose pause head is known: a paced
    engine (the committed H200 capacity; no weights), whose ``prs`` rise from 0 to 0.9
    over every ten steps (``pacing.WORD_EVERY``), so speech starts and stops every 0.8 s.
    Each turn comes as OpenAI's events in order, strictly as the SDK parses them."""
    session = {"type": "transcription", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 0,
        "silence_duration_ms": 160}}}}
    with servers.ServerProcess(tmp_path, batch_size=2, args=["--paced-engine", str(H200)]) \
            as server:
        server.wait_ready()
        client = openai.AsyncOpenAI(api_key="sk-local", base_url=f"{server.http_url}/v1")
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await events_until(conn, "session.created", 10)
            await conn.session.update(session=session)
            (updated,) = await events_until(conn, "session.updated", 10)
            audio = base64.b64encode(pcm16(3.0, seed=8).tobytes()).decode()
            await conn.input_audio_buffer.append(audio=audio)
            turns = await completions(conn, 2)
    strictly([updated, *turns])
    assert updated.session.audio.input.turn_detection.type == "server_vad"
    done = [e for e in turns if e.type.endswith("transcription.completed")]
    starts = []
    for completed in done:
        kinds = [e.type for e in turns if item_of(e) == completed.item_id
                 and not e.type.endswith(".delta")]
        assert kinds == [
            "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed", "conversation.item.added",
            "conversation.item.done", "conversation.item.input_audio_transcription.completed"]
        started, stopped = (next(e for e in turns if e.type == kind
                                 and e.item_id == completed.item_id)
                            for kind in ("input_audio_buffer.speech_started",
                                         "input_audio_buffer.speech_stopped"))
        # Speech for the steps whose pause is under 0.5, stopped two quiet steps on.
        assert stopped.audio_end_ms - started.audio_start_ms == (5 + 2) * 80
        starts.append(started.audio_start_ms)
    assert starts[1] - starts[0] == 10 * 80


def item_of(event: Any) -> str | None:
    item = getattr(event, "item", None)
    return item.id if item is not None else getattr(event, "item_id", None)


async def completions(conn: Any, count: int, timeout: float = 30.0) -> list[Any]:
    """Every event until ``count`` turns have completed."""
    out = []
    async with asyncio.timeout(timeout):
        async for event in conn:
            out.append(event)
            done = [e for e in out if e.type.endswith("transcription.completed")]
            if len(done) == count:
                return out
    raise AssertionError(f"the connection ended early: {[e.type for e in out]}")


async def test_an_idle_client_and_one_over_its_message_budget_are_told_and_closed(
        tmp_path: Path) -> None:
    """As a Kyutai client would be: ``idle_timeout`` after the idle timeout, and
    ``too_many_messages`` once events without audio outrun the budget; appends of
    audio are not held against it."""
    args = ["--idle-timeout-seconds", "1", "--max-messages-per-second", "5",
            "--message-burst", "10"]
    with servers.ServerProcess(tmp_path, batch_size=2, args=args) as server:
        server.wait_ready()
        client = openai.AsyncOpenAI(api_key="sk-local", base_url=f"{server.http_url}/v1")
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await events_until(conn, "session.created", 10)
            (idle,) = await events_until(conn, "error", 10)
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await events_until(conn, "session.created", 10)
            chunk = base64.b64encode(pcm16(0.08, seed=1).tobytes()).decode()
            for _ in range(30):  # 2.4 s of audio in 30 appends: within budget
                await conn.input_audio_buffer.append(audio=chunk)
            for _ in range(30):
                await conn.session.update(session=SESSION)
            said = await events_until(conn, "error", 10)
    strictly([idle, said[-1]])
    assert idle.error.code == "idle_timeout"
    assert said[-1].error.code == "too_many_messages"
    assert [e.type for e in said[:-1]] == ["session.updated"] * (len(said) - 1)
    assert 5 <= len(said) - 1 < 30  # the burst's updates were answered, not all thirty
