"""asrpool: a Kubernetes platform for serving streaming speech recognition.

The distribution maps the repo's top-level folders under this namespace:
``server/`` is :mod:`asrpool.server`, ``router/`` is :mod:`asrpool.router` and
``operator/`` is :mod:`asrpool.operator`; shared contracts live in :mod:`asrpool.common`.
"""

__version__ = "0.1.0"
