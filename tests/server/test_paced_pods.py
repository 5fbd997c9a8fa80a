"""A pod with a paced engine (``serve --paced-engine`` on the committed H200 bench capacity
result): real processes, a real websocket client, everything real but the model's forward;
in the engine thread and in an engine process. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from asrpool.common import processes
from tests.server import conftest
from tests.support import kyutai_client, servers

H200 = Path(__file__).resolve().parents[2] / "bench/results/capacity-stt-1b-en_fr-cuda.json"
FRAMES = 25  # before the marker: 2 s of audio
DELAY = 6  # stt-1b-en_fr's asr_delay_in_tokens
MODES = {"thread": ["--no-engine-process"], "process": []}  # a paced pod: a process unless told


@pytest.mark.parametrize("mode", list(MODES))
async def test_a_paced_pod_answers_as_the_measured_model(tmp_path: Path, mode: str) -> None:
    pcm = conftest.speechlike(FRAMES * 0.08, seed=11)
    with servers.ServerProcess(tmp_path, batch_size=4,
                               args=["--paced-engine", str(H200), *MODES[mode]]) as server:
        server.wait_ready()
        messages = await kyutai_client.transcribe(server.ws_url, pcm, short=True)
        steps = [m for m in messages if m["type"] == "Step"]
        assert [m["step_idx"] for m in steps] == list(range(1, FRAMES + DELAY + 1))
        assert messages[-2:] == [steps[-1], messages[-1]] and messages[-1]["id"] == 0
        assert {len(m["prs"]) for m in steps} == {4}  # stt-1b-en_fr's extra heads
        assert kyutai_client.words(messages) == [
            ("Word", "alfa", 0.0), ("EndWord", 0.32), ("Word", "bravo", 0.32),
            ("EndWord", 1.12), ("Word", "charlie", 1.12), ("EndWord", 1.92)]
        _assert_paced(server)
        assert (server.metric("asr_model_step_duration_count") or 0) >= FRAMES + DELAY
        engines = [server.pid, *_children(server)]
        assert len(engines) == (2 if mode == "process" else 1)
        assert not [pid for pid in engines if "libtorch" in Path(f"/proc/{pid}/maps").read_text()]
    where = "a child process" if mode == "process" else "a thread"
    assert f"the engine in {where}" in server.log()


def _assert_paced(server: servers.ServerProcess) -> None:
    """Its modules_info, its metrics and its ready line say it is a paced stand-in."""
    module = server.modules_info()
    assert (module["model"], module["paced"]) == (
        "stt-1b-en_fr", "stt-1b-en_fr (NVIDIA H200 bench capacity)")
    assert 'asr_paced_engine{measured_on="NVIDIA H200",model="stt-1b-en_fr"} 1.0' in (
        server.http_get("/metrics").splitlines())
    assert "ready: model stt-1b-en_fr PACED (a stand-in, no model runs: 3.07 ms per step " \
        "from the NVIDIA H200 bench capacity), 4 slots" in server.log()


def _children(server: servers.ServerProcess) -> list[int]:
    return [pid for pid, parent in processes.parents().items() if parent == server.pid
            and "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]


async def test_a_model_pod_says_nothing_of_pacing(
        idle_server: servers.ServerProcess) -> None:
    assert "paced" not in idle_server.modules_info()
    assert "asr_paced_engine{" not in idle_server.http_get("/metrics")
    assert "PACED" not in idle_server.log()
