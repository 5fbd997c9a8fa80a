"""Run the operator: kopf's reactor with our registry, until SIGINT/SIGTERM.

One replica runs standalone. Several share a kopf peering object: each announces itself
there with a priority, and only the highest acts; the others pause until it is gone
(it withdraws at a clean exit; a killed one lapses after kopf's peering lifetime, 60 s).
Priorities are random unless given, since kopf freezes every replica of a tie.
"""

from __future__ import annotations

import secrets

import kopf

from asrpool.common import logs
from asrpool.operator import handlers, settings

MAX_PRIORITY = 2**31 - 1


def run(config: settings.OperatorSettings) -> int:
    logs.configure(config.log_level)
    kopf.run(
        registry=handlers.build_registry(config),
        clusterwide=config.all_namespaces,
        namespaces=config.namespaces,
        standalone=config.peering is None,
        peering_name=config.peering,
        priority=priority(config),
        liveness_endpoint=config.liveness_endpoint,
    )
    return 0


def priority(config: settings.OperatorSettings) -> int:
    """The given priority, or a random one (ties between replicas are then negligible)."""
    if config.priority is not None:
        return config.priority
    return 1 + secrets.randbelow(MAX_PRIORITY)
