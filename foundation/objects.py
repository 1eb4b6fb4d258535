"""What the Kubernetes API server answers: objects as its JSON, typed once for every role.

``RawObject`` is an object (a Node, a Pod, a Workload, a Dataset, ...) as decoded JSON,
before any reader checks its shape (``admission.shape``, ``foundation.fluid``). The client
(``foundation.kube``), the admission check and the scaler's prewarm share this one alias.
Pure.
"""

from __future__ import annotations

from typing import Any, TypeAlias

RawObject: TypeAlias = dict[str, Any]
"""A Kubernetes object as the API server's decoded JSON: unchecked until read."""
