"""The engine in a child process (``--engine-process``): the same results as in the engine
thread, its failures the pod's, and no process left behind."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asrpool.common import processes, weights
from asrpool.server import engine_loop, enginechild, models, slots
from tests.server import conftest, reference
from tests.support import kyutai_client, servers

FRAME = slots.FRAME_SIZE
SPEC = enginechild.EngineSpec("tiny", batch_size=2, torch_threads=1)


def _batches(steps: int) -> Iterator[slots.Batch]:
    """Two streams from their first frame on; the second pauses for a few steps."""
    audio = {slot: conftest.speechlike(steps * 0.08, seed=slot + 1) for slot in (0, 1)}
    for i in range(steps):
        live = [0] if 10 <= i < 14 else [0, 1]
        frames = {slot: audio[slot][i * FRAME:(i + 1) * FRAME] for slot in live}
        yield slots.Batch(generations={0: 3, 1: 5}, resets=[0, 1] if i == 0 else [],
                          restarts=[0, 1] if i == 0 else [], markers=[], frames=frames,
                          arrivals=dict.fromkeys(frames, time.monotonic()),
                          buffered={slot: 7 * i + slot for slot in frames})


def _run(runner: engine_loop.Runner, steps: int) -> list[engine_loop.StepOutput]:
    try:
        runner.ready()
        return [runner.run(batch) for batch in _batches(steps)]
    finally:
        runner.close()


def test_a_child_runs_batches_exactly_as_the_engine_thread() -> None:
    alone = _run(engine_loop.InProcess(lambda: enginechild.build_engine(SPEC)), 30)
    child = enginechild.ChildRunner(SPEC, warmup_steps=2)
    beside = _run(child, 30)
    assert [(o.messages, o.markers) for o in beside] == [(o.messages, o.markers) for o in alone]
    assert [sorted(o.lags) for o in beside] == [sorted(o.lags) for o in alone]
    assert [(o.generations, o.buffered) for o in beside] == [
        (o.generations, o.buffered) for o in alone]
    assert sum(len(events) for o in alone for events in o.events.values()) > 30  # not empty
    assert not processes.alive(child.pid or 0)  # closed: the child has exited


def test_a_batch_handed_over_while_the_child_steps_the_last_gives_the_same_results() -> None:
    """Two batches in flight at a time, each in its own rows (submit N+1, then collect
    N): the same outputs, in order, as one batch at a time, though the rows of N+1 are
    written while the child reads those of N."""
    alone = _run(engine_loop.InProcess(lambda: enginechild.build_engine(SPEC)), 30)
    child = enginechild.ChildRunner(SPEC, warmup_steps=2)
    outputs = []
    try:
        child.ready()
        for batch in _batches(30):
            if child.full:
                outputs.append(child.collect())
            child.submit(batch)
            assert child.in_flight <= enginechild.BUFFERS
        while child.in_flight:
            outputs.append(child.collect())
    finally:
        child.close()
    assert [(o.messages, o.markers) for o in outputs] == [
        (o.messages, o.markers) for o in alone]
    assert [(o.generations, o.buffered) for o in outputs] == [
        (o.generations, o.buffered) for o in alone]
    assert all(o.handover >= 0 for o in outputs)


def test_a_child_that_cannot_load_raises_the_models_own_error(tmp_path: Path) -> None:
    spec = enginechild.EngineSpec(str(tmp_path / "no-such-checkpoint"), batch_size=1)
    runner = enginechild.ChildRunner(spec, warmup_steps=0)
    with pytest.raises(models.ModelError, match="does not exist"):
        runner.ready()
    runner.close()


def test_a_child_that_dies_raises_in_the_engine_thread() -> None:
    runner = enginechild.ChildRunner(SPEC, warmup_steps=0)
    try:
        runner.ready()
        os.kill(runner.pid or 0, signal.SIGKILL)
        with pytest.raises(enginechild.EngineChildError, match=r"exited .*without an answer"):
            runner.run(next(_batches(1)))
    finally:
        runner.close()


def _engine_children(server: servers.ServerProcess) -> list[int]:
    return [pid for pid, parent in processes.parents().items() if parent == server.pid
            and "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]


async def test_a_pod_with_its_engine_in_a_child_streams_the_same_words(tmp_path: Path) -> None:
    pcm = conftest.speechlike(3.0, seed=7)
    with servers.ServerProcess(tmp_path, args=["--engine-process"]) as server:
        server.wait_ready()
        (child,) = _engine_children(server)
        messages = await kyutai_client.transcribe(server.ws_url, pcm)
        assert kyutai_client.words(messages) == reference.file_words(pcm, conftest.BATCH)
        steps = server.metric("asr_model_step_duration_count")
        handovers = server.metric("asr_engine_handover_seconds_count")  # a later step's too
        assert steps and handovers and handovers >= steps
        assert (server.metric("asr_engine_handover_seconds_sum") or 0) > 0
        assert "asrpool.server.engine_loop: engine warmed up" in server.log()  # the child's
        assert "the engine in a child process, GIL switch 0.2 ms" in server.log()  # defaults
        server.signal(signal.SIGTERM)
        assert server.wait(60) == 0
    assert not processes.alive(child)


def test_a_pod_whose_engine_process_dies_fails_and_exits(tmp_path: Path) -> None:
    with servers.ServerProcess(tmp_path, args=["--engine-process"]) as server:
        server.wait_ready()
        (child,) = _engine_children(server)
        os.kill(child, signal.SIGKILL)
        assert server.wait(60) == 1
        assert "the engine process exited" in server.log().strip().splitlines()[-1]


def test_a_pod_whose_engine_process_cannot_load_exits_3(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-checkpoint"
    server = servers.ServerProcess(tmp_path, model=str(missing),
                                   args=["--engine-process"]).start()
    assert server.wait(120) == weights.EXIT_MODEL_UNAVAILABLE
    last = server.log().strip().splitlines()[-1]
    assert last.startswith(f"asrpool serve: checkpoint directory {missing} does not exist")
