"""``/api/build_info`` in moshi-server's shape, from what Python knows of this install.

moshi-server reports its build (vergen) as ten string fields; pods and routers answer
the same keys so that tools reading them work: this package's version in place of the
git description, Python's in place of rustc's, empty strings for what an installed
package does not know; plus ``asrpool_version`` and ``python_version``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import sys


@functools.cache
def build_info() -> dict[str, str]:
    version = _version()
    host = f"{platform.machine()}-{sys.platform}"
    return {
        "build_timestamp": "",  # unknown to an installed package
        "build_date": "",
        "git_branch": "",
        "git_timestamp": "",
        "git_date": "",
        "git_hash": "",
        "git_describe": version,
        "rustc_host_triple": host,
        "rustc_version": platform.python_version(),
        "cargo_target_triple": host,
        "asrpool_version": version,
        "python_version": platform.python_version(),
    }


def _version() -> str:
    try:
        return importlib.metadata.version("asrpool")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
