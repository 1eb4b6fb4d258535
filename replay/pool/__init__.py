"""The joint replay's pool: one heterogeneous GPU pool that training, batch and serving share.

The joint replay (``unitscale replay --pool ...``, issue #19) scales one pool from the
Alibaba GPU cluster trace (cluster-trace-gpu-v2023, the trace of the FGD paper) and
replays its training and batch tasks through a Kueue model onto GPUs shared HAMi-style,
next to the inference fleet, so that the placement policy's fragmentation and the
admission decisions are measured on the same traffic.

Modules:

- ``cluster``: the trace's node and pod lists as ``Node`` and ``Task`` values, with
  deterministic subsampling (pure parsing);
- ``placement``: ``Pool``, the per-node and per-GPU free state, and the placement
  policies (HAMi's binpack and spread, and FGD's fragmentation gradient), with FGD's
  measure of unallocatable GPUs (pure numpy);
- ``kueue``: one ClusterQueue (nominal quota, BestEffortFIFO) the replay admits through;
- ``joint``: the co-simulation itself, tick by tick, and its baselines.
"""
