"""One pod on a local node: its containers as host processes, its probes, its status.

A :class:`PodRunner` thread owns one pod for its life, as the kubelet's pod worker does:
it writes the pod's volumes, runs its init containers one after another, starts its
containers with their resolved environment on the pod's own loopback address, runs their
startup, readiness and liveness probes, restarts what exits or fails its liveness probe
(with back-off, by the pod's ``restartPolicy``), and reports the pod's status. When the
pod is deleted it runs the preStop hooks, sends SIGTERM, waits up to the termination
grace period, sends SIGKILL, and removes the pod from the API.

What differs from a kubelet, because no container runtime runs here: the command runs
on the host, not in the image; a container's "listen on every address" (0.0.0.0) is
rewritten to the pod's own address, as a network namespace would give it; paths under
a mount point are rewritten to the volume's folder; a pod that needs the API gets a
kubeconfig with its service account's token in ``KUBECONFIG`` (the in-cluster
``/var/run/secrets`` path cannot be mounted).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes

from asrpool.common import processes
from asrpool_harness.localcluster import nodes, podspecs, volumes

log = logging.getLogger(__name__)

TICK = 0.2
HOST_ENV = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")
ALL_ADDRESSES = re.compile(r"(?<![\d.])0\.0\.0\.0(?![\d.])")
Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Context:
    """What every pod runner shares: the API, how pods reach it, where files go."""

    api: kubernetes.client.ApiClient
    server: str
    ca_cert: Path
    workdir: Path
    events: Callable[[Obj, str, str, str], None]

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.api)


@dataclasses.dataclass
class ProbeTracker:
    probe: podspecs.Probe
    due: float
    successes: int = 0
    failures: int = 0
    passing: bool = False

    def record(self, ok: bool) -> None:
        self.successes, self.failures = (self.successes + 1, 0) if ok else (0, self.failures + 1)
        if self.successes >= self.probe.success_threshold:
            self.passing = True
        if self.failures >= self.probe.failure_threshold:
            self.passing = False


@dataclasses.dataclass
class Container:
    """One container: its process when running, and what its status reports."""

    spec: Obj
    init: bool = False
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: str = ""
    waiting: tuple[str, str] = ("ContainerCreating", "")
    terminated: Obj | None = None
    last_terminated: Obj | None = None
    next_start: float = 0.0
    probes: dict[str, ProbeTracker] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def started(self) -> bool:
        startup = self.probes.get("startupProbe")
        return self.running() and (startup is None or startup.passing)

    def ready(self) -> bool:
        readiness = self.probes.get("readinessProbe")
        return self.started() and (readiness is None or readiness.passing)

    def status(self) -> Obj:
        last = self.last_terminated
        if self.running():
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.waiting[0] or self.terminated is None:
            reason, message = self.waiting
            state = {"waiting": {"reason": reason or "ContainerCreating",
                                 **({"message": message} if message else {})}}
            last = self.terminated or last
        else:
            state = {"terminated": self.terminated}
        return {
            "name": self.name, "image": self.spec.get("image", ""), "imageID": "",
            "containerID": f"local://{self.process.pid}" if self.process else "",
            "ready": self.ready(), "started": self.started(),
            "restartCount": self.restarts, "state": state,
            "lastState": {"terminated": last} if last else {},
        }


class PodRunner:
    """One pod's worker; :meth:`start` runs it in a thread of its own."""

    def __init__(self, pod: Obj, node: nodes.NodeShape, address: str, context: Context) -> None:
        meta = pod["metadata"]
        self.pod, self.node, self.address, self.context = pod, node, address, context
        self.namespace, self.pod_name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.folder = context.workdir / "pods" / f"{self.namespace}_{self.pod_name}_{self.uid[:8]}"
        self.init_containers = [Container(c, init=True)
                                for c in pod["spec"].get("initContainers") or []]
        self.containers = [Container(c) for c in pod["spec"]["containers"]]
        self.restart_policy = pod["spec"].get("restartPolicy", "Always")
        self.deleting = threading.Event()
        self.grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        self.finished = threading.Event()
        self.start_time = nodes.now()
        self._environments: dict[str, tuple[list[str], dict[str, str]]] = {}
        self._initialized = False
        self._reported: Obj | None = None
        self._transitions: dict[str, tuple[str, str]] = {}  # condition -> (status, since)
        self._config_error = ""

    # The pod's life.

    def start(self) -> None:
        threading.Thread(target=self.run, name=f"pod {self.namespace}/{self.pod_name}",
                         daemon=True).start()

    def run(self) -> None:
        try:
            self._live()
            self._terminate()
        except Exception:
            log.exception("pod %s/%s: the node agent failed", self.namespace, self.pod_name)
            self._kill_all()
        finally:
            self._remove()
            self.finished.set()

    def request_stop(self, grace: float | None) -> None:
        if grace is not None:
            self.grace = min(self.grace, grace)
        self.deleting.set()

    def _live(self) -> None:
        self._report()
        while not self.deleting.is_set() and not self._prepare():
            self.deleting.wait(2.0)
        while not self.deleting.is_set():
            if not self._initialized:
                self._initialized = self._step_init()
            else:
                self._step_containers()
            self._report()
            if self._done():
                break
            self.deleting.wait(TICK)

    def _prepare(self) -> bool:
        """Volumes and every container's command line; False (reported) on a config error."""
        try:
            fields = podspecs.field_values(self.pod, self.address, self.node.address)
            folders = volumes.materialise(self.pod, self.folder, self._lookup, self._token, fields)
            base = self._base_environment()
            for container in [*self.init_containers, *self.containers]:
                own = podspecs.environment(container.spec, self._lookup, fields)
                mounts = podspecs.Mounts.of(container.spec, folders)
                argv = podspecs.command_line(container.spec, own)
                own = {key: self._localise(mounts.rewrite(value)) for key, value in own.items()}
                argv = [self._localise(part) for part in mounts.rewrite_all(argv)]
                # The host's values (PATH to the checkout's .venv, say) are host paths
                # already: a mount at /tmp must not turn them into folders of a volume.
                self._environments[container.name] = (argv, {**base, **own})
        except (podspecs.ConfigError, kubernetes.client.ApiException) as exc:
            message = str(exc) if isinstance(exc, podspecs.ConfigError) else _api_reason(exc)
            for container in [*self.init_containers, *self.containers]:
                container.waiting = ("CreateContainerConfigError", message)
            if message != self._config_error:
                self.context.events(self.pod, "Warning", "Failed", message)
                self._config_error = message
            self._report()
            return False
        return True

    def _localise(self, value: str) -> str:
        """Inside a pod, every address (0.0.0.0) is the pod's own."""
        return ALL_ADDRESSES.sub(self.address, value)

    def _base_environment(self) -> dict[str, str]:
        env = {key: os.environ[key] for key in HOST_ENV if key in os.environ}
        env["HOSTNAME"] = self.pod_name
        if self._mounts_service_account():
            env["KUBECONFIG"] = str(self._write_kubeconfig())
        return env

    def _mounts_service_account(self) -> bool:
        return any(mount.get("mountPath") == volumes.SERVICE_ACCOUNT_DIR
                   for container in self.pod["spec"]["containers"]
                   for mount in container.get("volumeMounts") or [])

    def _write_kubeconfig(self) -> Path:
        token = self._token(None, 3600)
        text = (f"apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n"
                f"    server: {self.context.server}\n"
                f"    certificate-authority: {self.context.ca_cert}\n"
                f"users:\n- name: pod\n  user:\n    token: {token}\n"
                f"contexts:\n- name: local\n  context:\n    cluster: local\n    user: pod\n"
                f"    namespace: {self.namespace}\ncurrent-context: local\n")
        path = self.folder / "kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _lookup(self, kind: str, name: str) -> dict[str, str] | None:
        core = self.context.core
        try:
            if kind == "configmap":
                return dict(core.read_namespaced_config_map(name, self.namespace).data or {})
            secret = core.read_namespaced_secret(name, self.namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return volumes.secret_text(secret.data)

    def _token(self, audience: str | None, seconds: int) -> str:
        account = self.pod["spec"].get("serviceAccountName", "default")
        spec: Obj = {"expirationSeconds": max(600, seconds), "boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.uid}}
        if audience:
            spec["audiences"] = [audience]
        answer = self.context.core.create_namespaced_service_account_token(
            account, self.namespace, {"spec": spec})
        return str(answer.status.token)

    # Init containers, then containers.

    def _step_init(self) -> bool:
        """Run the init containers in order; True once all have succeeded."""
        for container in self.init_containers:
            if container.terminated is not None and container.terminated["exitCode"] == 0:
                continue
            if container.running():
                return False
            if container.process is not None:
                self._exited(container)
                if container.terminated and container.terminated["exitCode"] == 0:
                    continue
            if time.monotonic() >= container.next_start and self._may_restart(container):
                self._start(container)
            return False
        return True

    def _step_containers(self) -> None:
        for container in self.containers:
            if container.running():
                self._probe(container)
            elif container.process is not None:
                self._exited(container)
            elif (time.monotonic() >= container.next_start and self._may_restart(container)):
                self._start(container)

    def _may_restart(self, container: Container) -> bool:
        if container.terminated is None and container.restarts == 0:
            return True  # never ran yet
        policy = "OnFailure" if container.init and self.restart_policy == "Always" \
            else self.restart_policy
        if policy == "Never":
            return False
        code = (container.terminated or container.last_terminated or {}).get("exitCode", 1)
        return policy == "Always" or code != 0

    def _start(self, container: Container) -> None:
        argv, env = self._environments[container.name]
        executable = shutil.which(argv[0], path=env.get("PATH"))
        if executable is None:
            self._cannot_start(container, f'exec: "{argv[0]}": executable file not found '
                                          "in $PATH")
            return
        if container.terminated is not None:
            container.last_terminated, container.terminated = container.terminated, None
            container.restarts += 1
        log_file = self.folder / f"{container.name}.log"
        cwd = Path(container.spec.get("workingDir") or self.folder)
        cwd.mkdir(parents=True, exist_ok=True)
        try:
            child = processes.spawn(container.name, [executable, *argv[1:]], log_file,
                                    env=env, cwd=cwd)
        except processes.StartError as exc:
            self._cannot_start(container, str(exc))
            return
        container.process, container.started_at = child.process, nodes.now()
        container.waiting = ("", "")
        container.probes = self._trackers(container)
        self.context.events(self.pod, "Normal", "Started", f"Started container {container.name}")

    def _cannot_start(self, container: Container, message: str) -> None:
        container.restarts += 1 if container.waiting[0] == "RunContainerError" else 0
        container.waiting = ("RunContainerError", message)
        container.next_start = time.monotonic() + podspecs.restart_delay(container.restarts + 1)
        self.context.events(self.pod, "Warning", "Failed", message)

    def _trackers(self, container: Container) -> dict[str, ProbeTracker]:
        trackers = {}
        start = time.monotonic()
        for which in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = podspecs.probe(container.spec, which)
            if probe is not None:
                trackers[which] = ProbeTracker(probe, start + probe.initial_delay)
        return trackers

    def _exited(self, container: Container) -> None:
        assert container.process is not None
        code = container.process.wait()
        container.process = None
        container.terminated = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": container.started_at, "finishedAt": nodes.now()}
        message = self._termination_message(container, code)
        if message:
            container.terminated["message"] = message
        container.waiting = ("", "")
        if self._may_restart(container) and not self.deleting.is_set():
            delay = podspecs.restart_delay(container.restarts + 1)
            container.next_start = time.monotonic() + delay
            if code != 0:
                container.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting "
                                     f"failed container={container.name} pod={self.pod_name}")
                self.context.events(self.pod, "Warning", "BackOff",
                                    f"Back-off restarting failed container {container.name}")

    def _termination_message(self, container: Container, code: int) -> str:
        """``terminationMessagePolicy: FallbackToLogsOnError``: a failed container's last
        log lines (the kubelet's 80 lines, at most 2048 bytes). The file policy needs a
        /dev/termination-log mount, which a host process cannot have."""
        if code == 0 or container.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return ""
        try:
            text = (self.folder / f"{container.name}.log").read_bytes()
        except OSError:
            return ""
        tail = b"\n".join(text.rstrip().splitlines()[-80:])[-2048:]
        return tail.decode(errors="replace")

    # Probes.

    def _probe(self, container: Container) -> None:
        startup = container.probes.get("startupProbe")
        order = ["startupProbe"] if startup and not startup.passing \
            else ["readinessProbe", "livenessProbe"]
        now = time.monotonic()
        for which in order:
            tracker = container.probes.get(which)
            if tracker is None or now < tracker.due:
                continue
            tracker.due = now + tracker.probe.period
            tracker.record(self._check(tracker.probe))
            failing = tracker.failures >= tracker.probe.failure_threshold
            if failing and which != "readinessProbe":
                self.context.events(self.pod, "Warning", "Unhealthy",
                                    f"{which} failed for container {container.name}; killing it")
                self._stop_container(container, self.grace)
                return

    def _check(self, probe: podspecs.Probe) -> bool:
        try:
            if probe.kind == "http":
                return _http_probe(self.address, probe)
            if probe.kind == "tcp":
                with socket.create_connection((self.address, probe.port), probe.timeout):
                    return True
            result = subprocess.run(list(probe.command), capture_output=True,
                                    timeout=probe.timeout, check=False, cwd=self.folder)
            return result.returncode == 0
        except (OSError, subprocess.TimeoutExpired, urllib.error.URLError, ssl.SSLError):
            return False

    # Status.

    def _done(self) -> bool:
        """Every container has ended for good (restartPolicy Never or OnFailure)."""
        if not self._initialized or self.restart_policy == "Always":
            return False
        return all(c.process is None and c.terminated is not None and not self._may_restart(c)
                   for c in self.containers)

    def status(self) -> Obj:
        containers_ready = self._initialized and all(c.ready() for c in self.containers)

        def condition(kind: str, value: bool) -> Obj:
            status = "True" if value else "False"
            before = self._transitions.get(kind)
            if before is None or before[0] != status:  # a transition: stamp it now
                self._transitions[kind] = before = (status, nodes.now())
            return {"type": kind, "status": status, "lastProbeTime": None,
                    "lastTransitionTime": before[1]}

        return {
            "phase": self._phase(),
            "hostIP": self.node.address, "hostIPs": [{"ip": self.node.address}],
            "podIP": self.address, "podIPs": [{"ip": self.address}],
            "startTime": self.start_time,
            "conditions": [condition("PodReadyToStartContainers", True),
                           condition("Initialized", self._initialized),
                           condition("ContainersReady", containers_ready),
                           condition("Ready", containers_ready)],
            "initContainerStatuses": [c.status() for c in self.init_containers],
            "containerStatuses": [c.status() for c in self.containers],
        }

    def _phase(self) -> str:
        if self._done():
            failed = any(c.terminated and c.terminated["exitCode"] != 0 for c in self.containers)
            return "Failed" if failed else "Succeeded"
        started = self._initialized and all(
            c.running() or c.terminated is not None for c in self.containers)
        return "Running" if started else "Pending"

    def _report(self) -> None:
        status = self.status()
        if status == self._reported:
            return
        try:
            self.context.core.patch_namespaced_pod_status(self.pod_name, self.namespace,
                                                          {"status": status})
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                log.warning("pod %s: status not written: %s", self.pod_name, _api_reason(exc))
            return
        self._reported = status

    # The end.

    def _terminate(self) -> None:
        deadline = time.monotonic() + self.grace
        running = [c for c in [*self.init_containers, *self.containers] if c.running()]
        for container in running:
            self._pre_stop(container, deadline)
            self.context.events(self.pod, "Normal", "Killing",
                                f"Stopping container {container.name}")
        for container in running:
            self._stop_container(container, max(0.0, deadline - time.monotonic()))
        self._report()

    def _pre_stop(self, container: Container, deadline: float) -> None:
        hook = ((container.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        if not hook:
            return
        env = self._environments[container.name][1]
        try:
            subprocess.run(list(hook["command"]), env=env, cwd=self.folder, check=False,
                           capture_output=True, timeout=max(0.1, deadline - time.monotonic()))
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.info("pod %s: preStop hook of %s: %s", self.pod_name, container.name, exc)

    def _stop_container(self, container: Container, grace: float) -> None:
        if container.process is None:
            return
        processes.terminate(container.process, grace)
        self._exited(container)

    def _kill_all(self) -> None:
        for container in [*self.init_containers, *self.containers]:
            if container.process is not None:
                processes.terminate(container.process, 0)
                container.process = None

    def _remove(self) -> None:
        """Delete the pod for good (the kubelet's last step of a graceful deletion)."""
        if not self.deleting.is_set():
            return
        options = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        try:
            self.context.core.delete_namespaced_pod(self.pod_name, self.namespace, body=options)
        except kubernetes.client.ApiException as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s: not removed: %s", self.pod_name, _api_reason(exc))


def _http_probe(address: str, probe: podspecs.Probe) -> bool:
    scheme = probe.scheme.lower()
    url = f"{scheme}://{address}:{probe.port}{probe.path}"
    context = None
    if scheme == "https":  # the kubelet does not verify a probe's certificate
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=probe.timeout, context=context) as answer:
            return 200 <= int(answer.status) < 400
    except urllib.error.HTTPError as exc:
        return 200 <= exc.code < 400


def _api_reason(exc: kubernetes.client.ApiException) -> str:
    return f"API error {exc.status}: {exc.reason}"
