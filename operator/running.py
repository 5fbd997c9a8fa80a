"""Run the operator: kopf's reactor with our registry, until SIGINT/SIGTERM."""

from __future__ import annotations

import logging

import kopf

from asrpool.operator import handlers, settings


def run(config: settings.OperatorSettings) -> int:
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    kopf.run(
        registry=handlers.build_registry(config),
        clusterwide=config.all_namespaces,
        namespaces=config.namespaces,
        standalone=True,  # one replica (Recreate); no kopf peering CRDs needed
        liveness_endpoint=config.liveness_endpoint,
    )
    return 0
