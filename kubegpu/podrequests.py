"""Kubernetes' rule for a pod's request of one resource, over its app, init and sidecar containers.

Shared by the scheduling core (scheduler/core/request.py: what a pod is charged) and the node agent
(crishim/podlookup.py: how many RDMA interfaces a pod's ``kubegpu.io/rdma`` request asks for), so
the two count alike. Pure; the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable


def effective_request(app: Iterable[int], init: Iterable[tuple[int, bool]], overhead: int = 0) -> int:
    """Kubernetes' pod request for one resource.

    ``app`` are the app containers' requests; ``init`` the init containers' ``(request,
    restartable)`` in declaration order (restartable: a sidecar, ``restartPolicy: Always``). The pod
    needs the larger of (the app containers plus every sidecar) and, for each regular init
    container, its own request plus the sidecars declared before it (they are running while it
    does); then ``overhead`` (``spec.overhead``) is added.
    """
    sidecars = 0
    peak = 0
    for value, restartable in init:
        if restartable:
            sidecars += value
        else:
            peak = max(peak, value + sidecars)
    return max(sum(app) + sidecars, peak) + overhead
