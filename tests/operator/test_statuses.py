"""The status: slot use, pod counts, and conditions that keep their transition times."""

from __future__ import annotations

from typing import Any

import pytest

from asrpool.common import registry
from asrpool.operator import naming, statuses, usage

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def deployment(replicas: int, ready: int, updated: int | None = None) -> dict[str, Any]:
    return {"metadata": {"generation": 2}, "status": {
        "observedGeneration": 2, "replicas": replicas, "readyReplicas": ready,
        "updatedReplicas": replicas if updated is None else updated}}


def observed(**overrides: Any) -> statuses.Observed:
    fields: dict[str, Any] = {
        "pool_name": "stt", "generation": 3, "desired_pods": 2, "deployment": deployment(2, 2),
        "slot_use": usage.Usage(slots=16, free_slots=10, active_streams=6, live_pods=2)}
    return statuses.Observed(**{**fields, **overrides})


def by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_healthy_pool() -> None:
    status = statuses.build(observed(), {}, NOW)
    assert {k: v for k, v in status.items() if k != "conditions"} == {
        "observedGeneration": 3, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
        "slots": 16, "freeSlots": 10, "activeStreams": 6,
        "selector": "app.kubernetes.io/name=asrpool-server,asrpool.io/pool=stt"}
    conditions = by_type(status)
    assert conditions["Ready"] == {
        "type": "Ready", "status": "True", "reason": "PodsReady",
        "message": "2/2 server pods ready; 10 of 16 slots free",
        "lastTransitionTime": NOW, "observedGeneration": 3}
    assert conditions["Progressing"]["status"] == "False"
    assert conditions["Degraded"]["status"] == "False"


def test_the_status_says_where_clients_stream_when_the_routers_address_is_known() -> None:
    url = naming.streaming_url("wss://asr.example.com", "speech/stt")
    assert url == "wss://asr.example.com/pools/speech/stt/api/asr-streaming"
    assert statuses.build(observed(url=url), {}, NOW)["url"] == url
    assert naming.streaming_url(None, "speech/stt") is None
    assert "url" not in statuses.build(observed(), {}, NOW)


def test_pods_not_ready_yet() -> None:
    conditions = by_type(statuses.build(observed(deployment=deployment(2, 1)), {}, NOW))
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False",
                                                                              "PodsNotReady")
    assert conditions["Progressing"]["status"] == "True"


def test_a_rollout_in_progress_is_progressing() -> None:
    conditions = by_type(statuses.build(observed(deployment=deployment(3, 2, updated=1)), {}, NOW))
    assert conditions["Progressing"]["reason"] == "RollingOut"
    assert "1/2 pods updated" in conditions["Progressing"]["message"]


def test_scaled_to_zero_is_ready() -> None:
    status = statuses.build(observed(desired_pods=0, deployment=deployment(0, 0)), {}, NOW)
    assert by_type(status)["Ready"]["reason"] == "ScaledToZero"


def test_an_invalid_spec_is_degraded_with_its_message() -> None:
    problem = statuses.Problem("InvalidSpec", "spec.slots=40 needs 5 GPUs")
    conditions = by_type(statuses.build(observed(problem=problem), {}, NOW))
    assert conditions["Degraded"]["status"] == "True"
    assert conditions["Degraded"]["message"] == "spec.slots=40 needs 5 GPUs"
    assert conditions["Progressing"]["reason"] == "InvalidSpec"


def test_unreadable_redis_keeps_the_last_slot_figures() -> None:
    previous = {"slots": 16, "freeSlots": 3, "activeStreams": 13}
    status = statuses.build(observed(slot_use=None), previous, NOW)
    assert (status["slots"], status["freeSlots"], status["activeStreams"]) == (16, 3, 13)


def test_a_condition_keeps_its_time_while_its_status_holds() -> None:
    first = statuses.build(observed(), {}, NOW)
    again = statuses.build(observed(), first, LATER)
    assert again == first
    assert not statuses.changed(first, again)
    flipped = statuses.build(observed(deployment=deployment(2, 1)), first, LATER)
    assert by_type(flipped)["Ready"]["lastTransitionTime"] == LATER
    assert by_type(flipped)["Degraded"]["lastTransitionTime"] == NOW
    assert statuses.changed(first, flipped)


def _pod(name: str, conditions: list[dict[str, str]] | None = None,
         waiting: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions or []}
    if waiting is not None:
        status["containerStatuses"] = [{"name": "server", "state": {"waiting": waiting}}]
    return {"metadata": {"name": name}, "status": status}


def test_pod_problems_name_what_a_platform_team_must_fix() -> None:
    verdict = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    unschedulable = _pod("p1", [{"type": "PodScheduled", "status": "False",
                                 "reason": "Unschedulable", "message": verdict}])
    crashing = _pod("p2", waiting={"reason": "CrashLoopBackOff", "message": "back-off 8s"})
    creating = _pod("p3", waiting={"reason": "ContainerCreating"})
    assert statuses.pod_problem(None, [creating]) is None
    assert statuses.pod_problem(None, [crashing, creating]) == statuses.Problem(
        "CrashLoopBackOff", "p2/server: back-off 8s")
    problem = statuses.pod_problem(None, [crashing, unschedulable])
    assert problem == statuses.Problem(
        "PodsUnschedulable", f"1 server pod(s) cannot be scheduled: {verdict}")
    stuck = {"status": {"conditions": [{"type": "Progressing", "status": "False",
                                        "reason": "ProgressDeadlineExceeded",
                                        "message": "ReplicaSet has timed out progressing."}]}}
    assert statuses.pod_problem(stuck, [crashing]) == statuses.Problem(
        "ProgressDeadlineExceeded", "ReplicaSet has timed out progressing.")
    leaving = _pod("p4", waiting={"reason": "ErrImagePull", "message": "not found"})
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert statuses.pod_problem(None, [leaving]) is None


@pytest.mark.parametrize(("waiting", "reason"), [
    ("ErrImageNeverPull", "ImagePullBackOff"), ("InvalidImageName", "ImagePullBackOff"),
    ("ImagePullBackOff", "ImagePullBackOff"), ("CreateContainerError", "CreateContainerError"),
])
def test_a_container_that_cannot_be_created_says_why(waiting: str, reason: str) -> None:
    message = 'Container image "ghcr.io/asrpool/asrpool:0.9" is not present with pull policy'
    pod = _pod("p1", waiting={"reason": waiting, "message": message})
    assert statuses.pod_problem(None, [pod]) == statuses.Problem(reason, f"p1/server: {message}")


def test_a_crash_loop_names_the_last_line_the_container_wrote() -> None:
    pod = _pod("p1", waiting={"reason": "CrashLoopBackOff", "message": "back-off 20s"})
    pod["status"]["containerStatuses"][0]["lastState"] = {"terminated": {
        "exitCode": 1, "message": "Traceback (most recent call last):\n  ...\n"
                                  "PermissionError: [Errno 13] /models\n"}}
    assert statuses.pod_problem(None, [pod]) == statuses.Problem(
        "CrashLoopBackOff",
        "p1/server: back-off 20s (exit code 1: PermissionError: [Errno 13] /models)")


# A model that cannot be had: the exit code names the reason, the last line the cause.

def _model_pod(name: str, *, init: list[dict[str, Any]] | None = None,
         containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {
        "initContainerStatuses": init or [], "containerStatuses": containers or []}}


def _backing_off(name: str, code: int, message: str) -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                "message": f"back-off 40s restarting {name}"}},
            "lastState": {"terminated": {"exitCode": code, "reason": "Error",
                                         "message": f"some log line\n{message}\n"}}}


def test_an_unreachable_hub_in_the_init_container_is_registry_unavailable() -> None:
    line = "asrpool fetch-model: cannot reach the Hugging Face Hub at https://hf.co"
    pods = [_model_pod("stt-a", init=[_backing_off("fetch-model", 4, line)],
                 containers=[{"name": "server", "state": {"waiting": {
                     "reason": "PodInitializing"}}}])]
    problem = statuses.pod_problem(None, pods)
    assert problem == statuses.Problem("RegistryUnavailable", f"container fetch-model: {line}")


def test_a_server_that_finds_no_model_files_is_model_unavailable() -> None:
    line = "asrpool serve: checkpoint directory /var/lib/asrpool/model is missing config.json"
    pods = [_model_pod("stt-a", containers=[_backing_off("server", 3, line)]),
            _model_pod("stt-b", containers=[_backing_off("server", 3, line)])]
    problem = statuses.pod_problem(None, pods)
    assert problem is not None and problem.reason == "ModelUnavailable"
    assert problem.message == f"container server: {line}"  # the same for every pod: one event
    assert problem == statuses.pod_problem(None, list(reversed(pods)))


def test_a_crash_of_another_kind_stays_crash_loop_back_off() -> None:
    pods = [_model_pod("stt-a", containers=[_backing_off("server", 1, "Traceback ...")])]
    problem = statuses.pod_problem(None, pods)
    assert problem is not None and problem.reason == "CrashLoopBackOff"
    assert problem.message.startswith("stt-a/server: back-off")


def test_a_missing_token_secret_in_the_init_container_is_a_config_error() -> None:
    waiting = {"name": "fetch-model", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "hf" not found'}}}
    problem = statuses.pod_problem(None, [_model_pod("stt-a", init=[waiting])])
    assert problem == statuses.Problem("CreateContainerConfigError",
                                       'stt-a/fetch-model: secret "hf" not found')


def test_a_server_ready_again_after_a_model_failure_is_no_problem() -> None:
    running = {"name": "server", "state": {"running": {}}, "ready": True,
               "lastState": {"terminated": {"exitCode": 3, "message": "gone"}}}
    assert statuses.pod_problem(None, [_model_pod("stt-a", containers=[running])]) is None


def test_a_retry_in_progress_is_still_the_problem() -> None:
    """The fetch running again, or the server loading again: no flapping status."""
    last = {"terminated": {"exitCode": 4, "message": "asrpool fetch-model: cannot reach"}}
    fetching = {"name": "fetch-model", "state": {"running": {}}, "ready": True,
                "lastState": last}
    problem = statuses.pod_problem(None, [_model_pod("stt-a", init=[fetching])])
    assert problem == statuses.Problem("RegistryUnavailable",
                                       "container fetch-model: asrpool fetch-model: cannot reach")
    loading = {"name": "server", "state": {"running": {}}, "ready": False,
               "lastState": {"terminated": {"exitCode": 3, "message": "no files"}}}
    problem = statuses.pod_problem(None, [_model_pod("stt-a", containers=[loading])])
    assert problem is not None and problem.reason == "ModelUnavailable"


def test_overloaded_pods_are_named_in_a_condition() -> None:
    behind = usage.summarise([
        registry.PodHeartbeat("ns/stt-a", "ns/stt", "10.0.0.1:8080", 8, 2, False, "tiny",
                              overloaded=True),
        registry.PodHeartbeat("ns/stt-b", "ns/stt", "10.0.0.2:8080", 8, 5, False, "tiny")])
    assert (behind.free_slots, behind.active_streams) == (5, 9)  # the overloaded offer none
    condition = by_type(statuses.build(observed(slot_use=behind), {}, NOW))["Overloaded"]
    assert (condition["status"], condition["reason"]) == ("True", "BehindRealTime")
    assert condition["message"] == "behind real time, admitting no new stream: ns/stt-a"
    keeping_up = by_type(statuses.build(observed(), {}, NOW))["Overloaded"]
    assert (keeping_up["status"], keeping_up["reason"]) == ("False", "KeepingUp")
    unknown = by_type(statuses.build(observed(slot_use=None), {}, NOW))["Overloaded"]
    assert unknown["status"] == "Unknown"
