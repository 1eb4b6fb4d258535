"""The names the admission check reads from Workloads and writes into podSetUpdates.

One place for every key, so the controller, its pure core, the manifests and the docs
agree. Ours live under ``unitscale.io/``; HAMi's and Fluid's are theirs, spelled as
their sources spell them (``../shared/reference/kueue-hami-fluid.md`` B2-B4, C5).
"""

from __future__ import annotations

from typing import Final

# --- set by users on a Job / Workload (metadata.annotations) -------------------------
DATASET: Final = "unitscale.io/dataset"
"""The Fluid Dataset (same namespace) the job reads; its cache must be warm first."""
LORA_BASE_MODEL: Final = "unitscale.io/lora-base-model"
"""Marks a LoRA fine-tuning workload and names the base model its tenants share."""

# --- written by us into podSetUpdates --------------------------------------------------
LORA_INSTANCE: Final = "unitscale.io/lora-instance"
"""Label on a LoRA tenant's pods: which base-model instance it shares."""

# --- on the objects we create (Fluid DataLoads) ----------------------------------------
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
"""The well-known label naming the tool that manages an object."""
MANAGER: Final = "unitscale-admission"
"""Our value of ``MANAGED_BY`` (a label value: the controller name's ``/`` is not allowed)."""
FOR_WORKLOAD: Final = "unitscale.io/workload"
"""Annotation on a DataLoad we made: the Workload that asked for it (names exceed 63)."""

# --- Kubernetes well-known labels --------------------------------------------------------
HOSTNAME: Final = "kubernetes.io/hostname"
"""The node label a nodeSelector pins one node with (LoRA co-location)."""

# --- what ties a pod to its Workload when its owner is not the Workload's -----------------
KUEUE_WORKLOAD: Final = "kueue.x-k8s.io/workload"
"""Kueue's annotation on the pods of an admitted Workload: the Workload's name (Kueue
0.17 sets it on every podSet's template while TopologyAwareScheduling is on, its
default; ``pkg/controller/jobframework/reconciler.go``)."""
JOBSET_UID: Final = "jobset.sigs.k8s.io/jobset-uid"
"""JobSet's label on its child Jobs and their pods: the JobSet's UID, which is the
Workload's owner (a pod's own owner is the child Job)."""

# --- HAMi (pod annotations read by its scheduler extender) -----------------------------
HAMI_GPU_POLICY: Final = "hami.io/gpu-scheduler-policy"
HAMI_NODE_POLICY: Final = "hami.io/node-scheduler-policy"
HAMI_USE_GPUTYPE: Final = "nvidia.com/use-gputype"
HAMI_NOUSE_GPUTYPE: Final = "nvidia.com/nouse-gputype"
HAMI_NODE_REGISTER: Final = "hami.io/node-nvidia-register"
HAMI_NODE_HANDSHAKE: Final = "hami.io/node-handshake"
HAMI_DEVICES_ALLOCATED: Final = "hami.io/vgpu-devices-allocated"
HAMI_VGPU_NODE: Final = "hami.io/vgpu-node"
"""The node HAMi's scheduler chose for a pod (its allocation lives on that node)."""
HAMI_DEVICE_CORDON: Final = "hami.io/device-cordon"

# --- HAMi resources (container requests / limits) --------------------------------------
GPU: Final = "nvidia.com/gpu"
GPU_MEMORY: Final = "nvidia.com/gpumem"
GPU_MEMORY_PERCENT: Final = "nvidia.com/gpumem-percentage"
GPU_CORES: Final = "nvidia.com/gpucores"


FLUID_CACHE_LABEL_PREFIX: Final = "fluid.io/s-"
"""Fluid's ``LabelAnnotationStorageCapacityPrefix``: cache-node labels start with it."""


def fluid_cache_node_label(namespace: str, dataset: str) -> str:
    """The label Fluid puts on nodes caching ``namespace/dataset`` (its ``node.go``).

    Only while the key stays under 63 characters; ``admission.fluid.cache_node_label``
    applies Fluid's fallback to the Dataset's UID beyond that.
    """
    return f"{FLUID_CACHE_LABEL_PREFIX}{namespace}-{dataset}"
