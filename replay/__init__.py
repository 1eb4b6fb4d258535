"""Trace replay: a simulated vLLM fleet under KEDA + HPA, every policy on the same traffic.

Pure simulation (``trace``, ``fleet``, ``keda``, ``policies``, ``simulate``) with time
passed in; ``report`` and ``cli`` are the shell. The ``unitscale`` policy answers through
the scaler's own ``ScaledObjectRegistry`` (the code that serves KEDA), fed by the
exporter's own signal derivation over simulated ``/metrics``.
"""
