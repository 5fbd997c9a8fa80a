"""Pool names as clients write them, and as the slot registry keys them.

A ``StreamingASRPool`` is named within its namespace, so the operator registers its pods
under ``namespace/name``: two pools called ``stt`` in two namespaces never share pods,
sessions or metrics. A client names ``namespace/name``, or a bare ``name``, which means
the router's own namespace (``--pool-namespace``; the chart sets the release namespace).
Without a pool namespace (the local platform) a bare name is the registry name itself.
"""

from __future__ import annotations

import re

from asrpool.common import registry

# A StreamingASRPool's name (a DNS subdomain) and a namespace's (a DNS label).
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def resolve(name: str, namespace: str | None) -> str | None:
    """The registry name of the pool a client asked for, or None if it is malformed."""
    scope, slash, bare = name.rpartition("/")
    if not _NAME.fullmatch(bare):
        return None
    if slash:
        return name if _NAMESPACE.fullmatch(scope) else None
    return registry.in_namespace(namespace, bare) if namespace else bare
