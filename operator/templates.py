"""What a pool passes through to its server pods' template, read, checked and merged.

``env``/``envFrom`` and ``volumeMounts`` go to the server container and the
``fetch-model`` init container (a proxy or a Hub mirror applies to both); ``volumes``,
``imagePullSecrets``, ``serviceAccountName``, ``runtimeClassName`` and
``topologySpreadConstraints`` to the pod; ``podMetadata`` labels and annotations to the
pod template, where the operator's own labels and annotations win (the selector and
the config hash must stay the operator's). Server pods do not mount a service-account
token unless ``automountServiceAccountToken`` says so: they never call the API.
Entries that would replace what the operator sets (an environment variable of the
ConfigMap or the downward API, a volume or mount path of its own) are refused with the
field's name: the Kubernetes API would silently take the last one.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from asrpool.operator import specs

Child = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PodTemplate:
    env: tuple[Child, ...] = ()
    env_from: tuple[Child, ...] = ()
    volumes: tuple[Child, ...] = ()
    volume_mounts: tuple[Child, ...] = ()
    image_pull_secrets: tuple[Child, ...] = ()
    service_account: str = ""
    automount_token: bool = False
    runtime_class: str = ""
    topology_spread: tuple[Child, ...] = ()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


def read(spec: specs.Section) -> PodTemplate:
    """The pass-through fields of ``spec``, read and checked."""
    automount = spec.boolean("automountServiceAccountToken", got=False)
    metadata = spec.section("podMetadata", got=False)
    return PodTemplate(
        env=_named(spec, "env"), env_from=spec.objects("envFrom"),
        volumes=_named(spec, "volumes"), volume_mounts=_named(spec, "volumeMounts"),
        image_pull_secrets=_named(spec, "imagePullSecrets"),
        service_account=spec.text("serviceAccountName", got=False), automount_token=automount,
        runtime_class=spec.text("runtimeClassName", got=False),
        topology_spread=spec.objects("topologySpreadConstraints"),
        labels=metadata.strings("labels"), annotations=metadata.strings("annotations"))


def check_reserved(template: PodTemplate, env_names: Iterable[str],
                   volume_names: Iterable[str], mount_paths: Iterable[str],
                   env_fields: Mapping[str, str] | None = None) -> None:
    """Refuse entries that would replace the operator's own; ``env_fields`` names the
    spec field that sets a reserved variable, for the refusal to point at."""
    _refuse("spec.env", "environment variable", [e["name"] for e in template.env], env_names,
            env_fields)
    _refuse("spec.volumes", "volume", [v["name"] for v in template.volumes], volume_names)
    _refuse_mounts([str(m.get("mountPath", "")) for m in template.volume_mounts], mount_paths)
    known = {v["name"] for v in template.volumes} | set(volume_names)
    unknown = [m["name"] for m in template.volume_mounts if m["name"] not in known]
    if unknown:
        raise specs.InvalidSpec(f"spec.volumeMounts names volume {unknown[0]!r}, which is not in"
                                " spec.volumes")


def _refuse_mounts(given: list[str], reserved: Iterable[str]) -> None:
    """A mount at, under or spelled as another name of a reserved path (``//models``,
    ``/tmp/../models``, ``/models/x``) would replace or shadow what the operator put there."""
    own = [normal_path(path) for path in reserved]
    for path in given:
        if not path.startswith("/"):
            raise specs.InvalidSpec(f"spec.volumeMounts: mount path {path!r} must be absolute")
        normal = normal_path(path)
        taken = [p for p in own if normal == p or normal.startswith(p + "/")]
        if taken:
            raise specs.InvalidSpec(
                f"spec.volumeMounts: mount path {path!r} is {normal!r}, at or under {taken[0]!r}"
                " which the operator mounts; use another path")


def normal_path(path: str) -> str:
    """The path a container runtime mounts at: ``.``, ``..`` and repeated slashes resolved."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def _refuse(field: str, what: str, given: list[str], reserved: Iterable[str],
            fields: Mapping[str, str] | None = None) -> None:
    taken = sorted(set(given) & set(reserved))
    if not taken:
        return
    instead = (fields or {}).get(taken[0])
    remedy = f"set {instead} instead" if instead else "remove it (or use another name)"
    raise specs.InvalidSpec(f"{field}: {what} {taken[0]!r} is set by the operator; {remedy}")


def pod_fields(template: PodTemplate) -> Child:
    """Pod spec fields of the template (the operator's own are added by the caller)."""
    fields: Child = {"automountServiceAccountToken": template.automount_token}
    if template.service_account:
        fields["serviceAccountName"] = template.service_account
    if template.runtime_class:
        fields["runtimeClassName"] = template.runtime_class
    if template.image_pull_secrets:
        fields["imagePullSecrets"] = [dict(item) for item in template.image_pull_secrets]
    if template.topology_spread:
        fields["topologySpreadConstraints"] = [dict(item) for item in template.topology_spread]
    return fields


def metadata(template: PodTemplate, labels: Mapping[str, str],
             annotations: Mapping[str, str]) -> Child:
    """The pod template's metadata: the pool's labels and annotations, the operator's on top."""
    return {"labels": {**template.labels, **labels},
            "annotations": {**template.annotations, **annotations}}


def add_to_container(container: Child, template: PodTemplate) -> Child:
    """The container with the template's environment and mounts after its own."""
    result = dict(container)
    if template.env:
        result["env"] = [*container.get("env", []), *map(dict, template.env)]
    if template.env_from:
        result["envFrom"] = [*container.get("envFrom", []), *map(dict, template.env_from)]
    if template.volume_mounts:
        result["volumeMounts"] = [*container.get("volumeMounts", []),
                                  *map(dict, template.volume_mounts)]
    return result


def _named(spec: specs.Section, field: str) -> tuple[Child, ...]:
    items = spec.sections(field)
    for item in items:
        if not isinstance(item.get("name"), str) or not item.get("name"):
            raise item.invalid("needs a name")
    names = [item.get("name") for item in items]
    doubled = sorted({name for name in names if names.count(name) > 1})
    if doubled and field != "volumeMounts":
        raise spec.error(field, f"names {doubled[0]!r} twice")
    return tuple(dict(item.raw) for item in items)


def secret_references(template: PodTemplate) -> list[str]:
    """Where the pass-through fields name a Secret (an environment variable's
    ``secretKeyRef``, an ``envFrom`` ``secretRef``, a volume of any type with a secret in
    it, projected sources included): each as ``field: name``. Image pull secrets are not
    among them (the kubelet uses them; the pod never sees them)."""
    found = []
    for field, entries in (("spec.env", template.env), ("spec.envFrom", template.env_from),
                           ("spec.volumes", template.volumes)):
        for entry in entries:
            if _names_a_secret(entry):
                found.append(f"{field}: {entry.get('name') or _secret_name(entry)}")
    return found


def _names_a_secret(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any("secret" in str(key).lower() or _names_a_secret(inner)
                   for key, inner in value.items())
    if isinstance(value, list):
        return any(_names_a_secret(item) for item in value)
    return False


def _secret_name(entry: Mapping[str, Any]) -> str:
    ref = entry.get("secretRef")
    return str(ref.get("name", "")) if isinstance(ref, Mapping) else "?"
