"""Rendered containers as the kubelet would run them: environment, command, settings."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pydantic_settings

from asrpool import cli
from tests.support import environs

PREFIX = "ASRPOOL_"
Environ = environs.Environ


def resolve_env(container: dict[str, Any],
                config_maps: Mapping[str, Mapping[str, str]] | None = None,
                secrets: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """The container's environment as the kubelet sets it: references to pod fields and
    to other Secrets than ``secrets`` (plain values) become placeholders, those to
    ``config_maps`` and ``secrets`` their values, and ``$(NAME)`` expands to earlier
    variables."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), item["value"])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            value = (config_maps or {})[ref["name"]][ref["key"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            known = (secrets or {}).get(ref["name"])
            value = known[ref["key"]] if known is not None else f"secret-{ref['name']}-{ref['key']}"
        else:
            value = "from-" + source["fieldRef"]["fieldPath"]
        env[item["name"]] = value
    return env


def check_fields(env: dict[str, str], settings_class: type[pydantic_settings.BaseSettings]) -> None:
    """Every ``ASRPOOL_*`` variable names a field (pydantic-settings ignores the others)."""
    unknown = [name for name in env if name.startswith(PREFIX)
               and name[len(PREFIX):].lower() not in settings_class.model_fields]
    assert unknown == [], f"{settings_class.__name__} reads no {unknown}"


def parse(container: dict[str, Any]) -> Any:
    """The container's command and args, parsed by the real ``asrpool`` parser."""
    argv = [*container["command"], *container.get("args", [])]
    assert argv[0] == "asrpool", "the images' entry point is the asrpool command"
    return cli.build_parser().parse_args(argv[1:])
