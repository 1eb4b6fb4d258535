"""What every role stands on: errors, durations, config, Kubernetes, gRPC setup.

Errors, durations, addresses and DNS, config files and their hot reload, Kubernetes
access and EndpointSlice discovery, the gRPC server setup and Timestamp conversion. It
imports only ``protos`` and libraries, never a role (``scaler``, ``exporter``,
``serving``, ``admission``), the replay or the app; import-linter holds it to that.
"""
