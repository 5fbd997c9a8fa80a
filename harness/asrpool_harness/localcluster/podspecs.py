"""A pod's containers as the kubelet reads them: environment, command line, probes, mounts.

Pure functions of the pod object and of a lookup for ConfigMaps and Secrets, shared by
the node agent and the operator tests' emulated kubelet.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

Obj = Mapping[str, Any]
# ("configmap" | "secret", name) -> its data as text, or None when it does not exist.
Lookup = Callable[[str, str], "dict[str, str] | None"]

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ConfigError(ValueError):
    """The pod refers to something that is not there (the kubelet's
    ``CreateContainerConfigError``); the message says what."""


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is one ``$``,
    an undefined reference stays as written."""
    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])
    return _REFERENCE.sub(replace, value)


def field_values(pod: Obj, pod_ip: str, host_ip: str) -> dict[str, str]:
    """What ``valueFrom.fieldRef`` can name (the downward API)."""
    meta, spec = pod["metadata"], pod["spec"]
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta.get("namespace", "default"),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    for key in ("labels", "annotations"):
        for name, value in (meta.get(key) or {}).items():
            values[f"metadata.{key}['{name}']"] = value
    return values


def environment(container: Obj, lookup: Lookup, fields: Mapping[str, str],
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``envFrom`` in order, then ``env`` in order (later entries win; each ``value`` may
    refer to the entries before it)."""
    env = dict(base or {})
    for source in container.get("envFrom") or []:
        env.update(_env_from(source, lookup))
    for item in container.get("env") or []:
        value = _env_value(item, container, lookup, fields, env)
        if value is not None:
            env[item["name"]] = value
    return env


def _env_from(source: Obj, lookup: Lookup) -> dict[str, str]:
    kind, ref = ("configmap", source["configMapRef"]) if "configMapRef" in source \
        else ("secret", source["secretRef"])
    data = lookup(kind, ref["name"])
    if data is None:
        if ref.get("optional"):
            return {}
        raise ConfigError(f'{kind} "{ref["name"]}" not found')
    prefix = source.get("prefix", "")
    return {f"{prefix}{key}": value for key, value in data.items()}


def _env_value(item: Obj, container: Obj, lookup: Lookup, fields: Mapping[str, str],
               env: Mapping[str, str]) -> str | None:
    if "valueFrom" not in item:
        return expand(str(item.get("value", "")), env)
    source = item["valueFrom"]
    if "fieldRef" in source:
        path = source["fieldRef"]["fieldPath"]
        if path not in fields:
            raise ConfigError(f"unsupported fieldRef {path!r} in env {item['name']}")
        return fields[path]
    if "resourceFieldRef" in source:
        return _resource_value(container, source["resourceFieldRef"]["resource"])
    kind, ref = ("configmap", source["configMapKeyRef"]) if "configMapKeyRef" in source \
        else ("secret", source["secretKeyRef"])
    data = lookup(kind, ref["name"])
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        what = f'{kind} "{ref["name"]}"' + ("" if data is None else f' key "{ref["key"]}"')
        raise ConfigError(f"{what} not found (env {item['name']})")
    return data[ref["key"]]


def _resource_value(container: Obj, resource: str) -> str:
    group, _, name = resource.partition(".")
    value = ((container.get("resources") or {}).get(group) or {}).get(name)
    return str(value) if value is not None else "0"


def command_line(container: Obj, env: Mapping[str, str]) -> list[str]:
    """``command`` then ``args``, each expanded. The agent runs no images, so a container
    without a command cannot run."""
    command = [expand(str(part), env) for part in container.get("command") or []]
    if not command:
        raise ConfigError(f"container {container['name']} has no command: the local node "
                          "agent runs commands on the host, not images' entrypoints")
    return command + [expand(str(part), env) for part in container.get("args") or []]


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe, read from a container: HTTP GET, TCP connect or a command."""

    kind: str  # "http" | "tcp" | "exec"
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    command: tuple[str, ...] = ()
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def probe(container: Obj, which: str) -> Probe | None:
    """The container's ``startupProbe``, ``readinessProbe`` or ``livenessProbe``."""
    spec = container.get(which)
    if not spec:
        return None
    timing: dict[str, Any] = {
        "initial_delay": float(spec.get("initialDelaySeconds", 0)),
        "period": float(spec.get("periodSeconds", 10)),
        "timeout": float(spec.get("timeoutSeconds", 1)),
        "success_threshold": int(spec.get("successThreshold", 1)),
        "failure_threshold": int(spec.get("failureThreshold", 3)),
    }
    if "httpGet" in spec:
        http = spec["httpGet"]
        return Probe("http", container_port(container, http["port"]), http.get("path", "/"),
                     http.get("scheme", "HTTP"), **timing)
    if "tcpSocket" in spec:
        return Probe("tcp", container_port(container, spec["tcpSocket"]["port"]), **timing)
    if "exec" in spec:
        return Probe("exec", command=tuple(spec["exec"]["command"]), **timing)
    raise ConfigError(f"{which} of container {container['name']}: unsupported probe type")


def container_port(container: Obj, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise ConfigError(f"container {container['name']} has no port named {port!r}")


@dataclasses.dataclass
class Mounts:
    """Where each of a container's mount paths is on the host.

    Without a mount namespace a process sees the host's file system, so the agent
    rewrites paths under a mount point in the container's environment and arguments to
    the folder that holds the volume's files.
    """

    table: dict[str, Path] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, container: Obj, volumes: Mapping[str, Path]) -> Mounts:
        table: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in volumes:
                raise ConfigError(f"volume {mount['name']!r} of container "
                                  f"{container['name']} is not defined in the pod")
            source = volumes[mount["name"]]
            table[mount["mountPath"].rstrip("/") or "/"] = source / mount.get("subPath", "")
        return cls(table)

    def rewrite(self, value: str) -> str:
        """One pass, the longest mount path first: a path already rewritten to a host
        folder is never rewritten again (a hostPath under /tmp with a mount at /tmp)."""
        if not self.table:
            return value
        paths = "|".join(re.escape(path) for path in sorted(self.table, key=len, reverse=True))
        pattern = re.compile(r"(^|[=:,])(" + paths + r")(?=/|$|[:,])")
        return pattern.sub(lambda match: match[1] + str(self.table[match[2]]), value)

    def rewrite_all(self, values: Sequence[str]) -> list[str]:
        return [self.rewrite(value) for value in values]


def restart_delay(restarts: int, base: float = 1.0, cap: float = 30.0) -> float:
    """The kubelet's crash-loop back-off, doubled per restart up to a cap (its cap is
    five minutes; tests need a shorter one)."""
    return float(min(cap, base * 2 ** max(0, restarts - 1)))
