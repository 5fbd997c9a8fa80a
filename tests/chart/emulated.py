"""The test's own hands on the operator's emulated API server (tests/operator/emulator.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tests.operator import emulator


async def retried(send: Callable[[], Awaitable[Any]],
                   done: Callable[[], bool] = lambda: False) -> None:
    """The test's own writes, again if the emulator's aiohttp server drops the connection
    (it sometimes crashes logging a request): the operator is what is under test."""
    for attempt in range(3):
        try:
            await send()
            return
        except aiohttp.ClientOSError:
            if attempt == 2:
                raise
            if done():
                return


def run_pods(cluster: emulator.Cluster, namespace: str, deployment_name: str) -> list[str]:
    """The Deployment's pods, put straight into the emulator (no HTTP: see retried)."""
    deployment = cluster.get(emulator.DEPLOYMENTS, namespace, deployment_name)
    assert deployment is not None
    names = [f"{deployment_name}-{index}" for index in range(deployment["spec"]["replicas"])]
    for index, name in enumerate(names):
        cluster.emulator.objects[emulator.PODS, namespace, name] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(index),
                         "labels": dict(deployment["spec"]["template"]["metadata"]["labels"])}}
    return names
