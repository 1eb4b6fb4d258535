"""unitscale: autoscaling and admission for LLM inference and training on Kubernetes.

This package holds what every role shares: the command line, Go-style durations and
the error tree. The roles live in their own top-level packages (``scaler``,
``exporter``, ``serving``, ``admission``) and the wire contracts in ``protos``.
"""

__version__ = "0.1.0"
