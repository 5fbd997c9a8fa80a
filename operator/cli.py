"""Subcommands of the operator (registered into the ``asrpool`` command).

Registering imports nothing heavy: kopf, kubernetes and pydantic load only when the
subcommand runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pydantic

    from asrpool.operator import settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the Kubernetes operator for StreamingASRPool resources",
        description="Run the kopf operator that turns StreamingASRPool resources into server"
        " pods. Every flag can also be set as an ASRPOOL_* environment variable; flags win.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", dest="namespaces", action="append", metavar="NAME",
                       help="watch this namespace (repeatable; ASRPOOL_NAMESPACES=a,b)")
    scope.add_argument("-A", "--all-namespaces", action="store_const", const=True,
                       help="watch every namespace (ASRPOOL_ALL_NAMESPACES=true)")
    parser.add_argument("--redis-url", help="Redis the pods heartbeat to (ASRPOOL_REDIS_URL)")
    parser.add_argument("--pod-redis-url",
                        help="Redis URL as the server pods reach it, if not --redis-url")
    parser.add_argument("--redis-password-file",
                        help="file holding the Redis password (or ASRPOOL_REDIS_PASSWORD)")
    parser.add_argument("--redis-password-secret", metavar="NAME",
                        help="Secret in each pool's namespace holding the Redis password for"
                        " the server pods (they get it by reference)")
    parser.add_argument("--redis-password-secret-key", metavar="KEY",
                        help="key of the password in that Secret (default: password)")
    parser.add_argument("--redis-timeout-seconds", type=float,
                        help="longest wait for one Redis call (default 2)")
    parser.add_argument("--default-image", help="server image for pools that name none")
    parser.add_argument("--resync-seconds", type=float,
                        help="seconds between passes over each pool (drift, status, autoscaling)")
    parser.add_argument("--termination-margin-seconds", type=int,
                        help="termination grace beyond a pool's drain grace period")
    parser.add_argument("--kube-api-url",
                        help="plain HTTP API endpoint such as `kubectl proxy`; default:"
                        " in-cluster credentials, then kubeconfig")
    parser.add_argument("--liveness", dest="liveness_endpoint", metavar="URL",
                        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument("--network-policy", action=argparse.BooleanOptionalAction,
                        help="make a NetworkPolicy per pool (default: on)")
    parser.add_argument("--network-policy-from", type=json.loads, metavar="JSON",
                        help="the peers its server port admits, as NetworkPolicy 'from'"
                        " entries (default: router pods of any namespace)")
    parser.add_argument("--default-pod-token-secret", metavar="NAME",
                        help="Secret with the router-to-pod token for pools that name none"
                        " (in each pool's namespace)")
    parser.add_argument("--default-pod-token-key", metavar="KEY",
                        help="its key (default: token)")
    parser.add_argument("--peering", metavar="NAME",
                        help="run as one of several replicas through the kopf peering object"
                        " NAME: only the one of highest priority acts (default: standalone)")
    parser.add_argument("--priority", type=int,
                        help="this replica's peering priority (default: a random one)")
    parser.add_argument("--log-level", help="debug, info, warning, error")
    parser.set_defaults(handler=_run)


_FIELDS = (
    "namespaces", "all_namespaces", "redis_url", "pod_redis_url", "redis_timeout_seconds",
    "redis_password_file", "redis_password_secret", "redis_password_secret_key",
    "default_image",
    "resync_seconds", "termination_margin_seconds", "kube_api_url", "liveness_endpoint",
    "log_level", "peering", "priority", "network_policy", "network_policy_from",
    "default_pod_token_secret", "default_pod_token_key",
)


def load_settings(args: argparse.Namespace) -> settings.OperatorSettings:
    """Flags over ``ASRPOOL_*`` environment variables over defaults."""
    from asrpool.operator import settings

    given = {name: getattr(args, name) for name in _FIELDS if getattr(args, name) is not None}
    return settings.OperatorSettings(**given)


def _run(args: argparse.Namespace) -> int:
    import pydantic

    from asrpool.common import redis_clients
    from asrpool.operator import running

    try:
        config = load_settings(args)
        config.redis_password_value()  # an unreadable password file fails here, not later
    except pydantic.ValidationError as exc:
        print(f"asrpool operator: {_errors(exc)}", file=sys.stderr)
        return 2
    except redis_clients.RedisPasswordError as exc:
        print(f"asrpool operator: {exc}", file=sys.stderr)
        return 2
    return running.run(config)


def _errors(exc: pydantic.ValidationError) -> str:
    return "; ".join(str(error["msg"]) for error in exc.errors())
