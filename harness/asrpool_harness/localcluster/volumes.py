"""A pod's volumes as folders on the host.

ConfigMap, Secret, downward API and projected volumes (service-account tokens among
them) are written into the pod's folder; an emptyDir is an empty folder there; a
hostPath is the host path itself. Other volume types (persistent volume claims, CSI)
need a storage driver this machine has not got: the pod is refused with that reason.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from asrpool_harness.localcluster import podspecs

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# (audience, expiration seconds) -> a token for the pod's service account, bound to it.
TokenSource = Callable[[str | None, int], str]


def materialise(pod: Mapping[str, Any], root: Path, lookup: podspecs.Lookup,
                tokens: TokenSource, fields: Mapping[str, str]) -> dict[str, Path]:
    """Each volume's host folder, by volume name."""
    folders: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        if "hostPath" in volume:
            folders[name] = _host_path(volume["hostPath"])
            continue
        folder = root / "volumes" / name
        folder.mkdir(parents=True, exist_ok=True)
        _fill(volume, folder, lookup, tokens, fields)
        folders[name] = folder
    return folders


def _host_path(spec: Mapping[str, Any]) -> Path:
    path = Path(spec["path"])
    kind = spec.get("type", "")
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    if kind == "Directory" and not path.is_dir():
        raise podspecs.ConfigError(f"hostPath {path} is not a directory")
    return path


def _fill(volume: Mapping[str, Any], folder: Path, lookup: podspecs.Lookup,
          tokens: TokenSource, fields: Mapping[str, str]) -> None:
    if "emptyDir" in volume:
        return
    if "configMap" in volume:
        _write_data(folder, _source_data("configmap", volume["configMap"], lookup),
                    volume["configMap"].get("items"))
    elif "secret" in volume:
        spec = {**volume["secret"], "name": volume["secret"].get("secretName", "")}
        _write_data(folder, _source_data("secret", spec, lookup), spec.get("items"))
    elif "downwardAPI" in volume:
        _write_downward(folder, volume["downwardAPI"].get("items") or [], fields)
    elif "projected" in volume:
        for source in volume["projected"].get("sources") or []:
            _fill_projection(source, folder, lookup, tokens, fields)
    else:
        kinds = sorted(set(volume) - {"name"})
        raise podspecs.ConfigError(f"volume {volume['name']!r}: {', '.join(kinds)} volumes "
                                   "need a storage driver the local node agent does not have")


def _fill_projection(source: Mapping[str, Any], folder: Path, lookup: podspecs.Lookup,
                     tokens: TokenSource, fields: Mapping[str, str]) -> None:
    if "serviceAccountToken" in source:
        spec = source["serviceAccountToken"]
        token = tokens(spec.get("audience"), int(spec.get("expirationSeconds", 3607)))
        _write(folder / spec["path"], token)
    elif "configMap" in source:
        _write_data(folder, _source_data("configmap", source["configMap"], lookup),
                    source["configMap"].get("items"))
    elif "secret" in source:
        _write_data(folder, _source_data("secret", source["secret"], lookup),
                    source["secret"].get("items"))
    elif "downwardAPI" in source:
        _write_downward(folder, source["downwardAPI"].get("items") or [], fields)


def _source_data(kind: str, spec: Mapping[str, Any], lookup: podspecs.Lookup) -> dict[str, str]:
    data = lookup(kind, spec["name"])
    if data is None:
        if spec.get("optional"):
            return {}
        raise podspecs.ConfigError(f'{kind} "{spec["name"]}" not found (volume)')
    return data


def _write_data(folder: Path, data: Mapping[str, str], items: list[Any] | None) -> None:
    if items is None:
        for key, value in data.items():
            _write(folder / key, value)
        return
    for item in items:
        if item["key"] not in data:
            raise podspecs.ConfigError(f"key {item['key']!r} not found for a volume item")
        _write(folder / item["path"], data[item["key"]])


def _write_downward(folder: Path, items: list[Any], fields: Mapping[str, str]) -> None:
    for item in items:
        if "fieldRef" in item:
            _write(folder / item["path"], fields.get(item["fieldRef"]["fieldPath"], ""))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def secret_text(data: Mapping[str, str] | None) -> dict[str, str]:
    """A Secret's ``data`` (base64) as text."""
    return {key: base64.b64decode(value).decode(errors="replace")
            for key, value in (data or {}).items()}
