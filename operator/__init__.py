"""The kopf operator for ``StreamingASRPool`` resources (``asrpool operator``).

Importing this package loads nothing: kopf and the Kubernetes client load with
:mod:`asrpool.operator.handlers` when the operator runs.
"""
