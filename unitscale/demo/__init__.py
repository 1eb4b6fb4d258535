"""``unitscale demo``: the whole loop on one machine, no cluster, no GPU.

Real processes talk over loopback: the gateway, simulated vLLM replicas (or real
vLLM for CPUs), the exporter and the scaler, each its own ``unitscale`` process. The
demo plays KEDA + HPA against the scaler over gRPC (``keda``), starts and stops
replica processes with their cold start (``fleet``), replays a trace through the
gateway (``load``), shows it live (``view``) and writes a report that sets the live
run beside the replay simulator's prediction for the same trace and settings
(``report``). Time is compressed by one factor everywhere (``world``).
"""

from unitscale.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
