"""unitscale: autoscaling and admission for LLM inference and training on Kubernetes.

This package is the application on top: the ``unitscale`` command (``cli``) and the
local demo (``demo``). Beneath it lie the replay (``replay``), the roles (``scaler``,
``exporter``, ``serving``, ``admission``), the foundation they share (``foundation``)
and the wire contracts (``protos``); docs/development.md draws the layers.
"""

__version__ = "0.1.0"
