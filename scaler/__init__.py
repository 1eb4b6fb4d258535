"""The KEDA external scaler: signals in, replica counts out.

``scaler.core`` is the pure decision code (no I/O, no clock); the other modules are
the shell around it: trigger metadata, signal store and sources, the gRPC service.
"""
