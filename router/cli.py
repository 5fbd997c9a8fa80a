"""``asrpool route``: run one router replica (registered into the ``asrpool`` command).

Heavy imports (FastAPI, Redis, uvicorn) happen only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Flags that map one to one onto RouterSettings fields; environment variables
# (ASRPOOL_REDIS_URL, ...) fill in what the flags leave out.
_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--redis-url", {"help": "Redis of the slot registry (redis://host:port/db, no password)"}),
    ("--redis-password-file", {"help": "file with the Redis password (or ASRPOOL_REDIS_PASSWORD)"}),
    ("--host", {"help": "address to listen on"}),
    ("--port", {"type": int, "help": "port to listen on"}),
    (
        "--policy",
        {
            "choices": ["pack", "spread"],
            "help": "pack: busiest pod with room (default); spread: emptiest pod",
        },
    ),
    ("--api-keys-file", {"help": "YAML/JSON file of hashed API keys (none: no auth)"}),
    (
        "--queue-timeout-seconds",
        {"type": float, "help": "seconds to wait for a free slot (0: refuse at once)"},
    ),
    ("--queue-max", {"type": int, "help": "waiters one pool's queue holds at most"}),
    (
        "--queue-max-per-key",
        {"type": int, "help": "waiters of one API key in a pool's queue at most (0: any)"},
    ),
    ("--pod-token", {"help": "shared secret sent to pods in the asrpool-pod-token header"}),
    ("--default-pool", {"help": "pool for clients that name none"}),
    ("--pool-namespace", {"help": "namespace of pools named without one (NAME = NAMESPACE/NAME)"}),
    (
        "--resume-grace-seconds",
        {"type": float, "help": "how long a dropped client may resume (match the pods')"},
    ),
    ("--session-lease-ms", {"type": int, "help": "lease of a session record, renewed every third"}),
    ("--router-id", {"help": "this replica's name in session records"}),
    (
        "--workers",
        {"type": int, "help": "router processes on the port, sharing only Redis (default: CPUs)"},
    ),
    ("--max-message-bytes", {"type": int, "help": "largest client frame (default 16 MiB)"}),
    ("--max-upload-bytes", {"type": int, "help": "largest POST /api/asr-streaming body"}),
    ("--ping-interval-seconds", {"type": float, "help": "websocket ping period towards clients"}),
    ("--ping-timeout-seconds", {"type": float, "help": "drop a client not answering a ping"}),
    (
        "--send-timeout-seconds",
        {"type": float, "help": "drop a client whose unread bytes stall the relay this long"},
    ),
    ("--max-head-bytes", {"type": int, "help": "largest request line + headers (else 431)"}),
    ("--max-headers", {"type": int, "help": "most request header lines (else 431)"}),
    ("--max-url-bytes", {"type": int, "help": "longest path + query (else 414)"}),
    (
        "--handshake-timeout-seconds",
        {"type": float, "help": "a request head must be complete within this (else 408)"},
    ),
    ("--max-connections", {"type": int, "help": "connections per worker process (else 503)"}),
    (
        "--new-streams-per-second",
        {"type": float, "help": "per client address and per API key (else 429; 0: any)"},
    ),
    ("--new-streams-burst", {"type": float, "help": "new streams one client may save up"}),
    (
        "--gpu-hour-price",
        {"type": float, "help": "dollars per GPU-hour: /api/pools and /metrics show the cost"},
    ),
    ("--gpus-per-pod", {"type": float, "help": "GPUs of one server pod (default 1)"}),
    ("--log-level", {"help": "uvicorn log level"}),
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "route",
        help="run a router: one websocket endpoint in front of a pool of server pods",
        description="Admit streams atomically in Redis, pin them to pods, proxy them. "
        "Every flag can also be set as an ASRPOOL_* environment variable; flags win.",
    )
    for flag, options in _FLAGS:
        parser.add_argument(flag, default=None, **options)
    parser.set_defaults(handler=run)


def settings_from(args: argparse.Namespace) -> Any:
    from asrpool.router import settings

    given = {
        flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_"))
        for flag, _ in _FLAGS
    }
    return settings.RouterSettings(**{k: v for k, v in given.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    import pydantic

    from asrpool.common import auth, redis_clients
    from asrpool.router import serving

    try:
        config = settings_from(args)
        return serving.serve(config)
    except pydantic.ValidationError as exc:
        print(f"asrpool route: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    except (auth.KeyFileError, redis_clients.RedisPasswordError) as exc:
        print(f"asrpool route: {exc}", file=sys.stderr)
        return 2
