"""Which RDMA VFs a pod holds, from its signed allocation, as kubegpu-cni reads it.

Where the annotations come from, in order:

1. the runtime: containerd (and CRI-O) pass the pod's annotations as ``runtimeConfig`` key
   ``io.kubernetes.cri.pod-annotations`` to a plugin whose config declares that capability;
2. the API (``kubeconfig`` in the plugin config): the pod named by ``K8S_POD_NAMESPACE`` and
   ``K8S_POD_NAME`` in ``CNI_ARGS``.

The annotation is verified as the shim verifies it (``kubegpu.allocation.verify`` with the public
keys of the node's key directory), then checked to be for this node and this pod's UID.
``decide`` is the pure decision; ``read_annotations`` does the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubegpu.allocation import (
    ANNOTATION,
    RDMA_INTERFACES_ANNOTATION,
    AllocationError,
    KeyRing,
    RdmaInterface,
    asks_rdma,
    verify,
)
from kubegpu.cni.protocol import (
    ALLOCATION_REJECTED,
    INVALID_CONFIG,
    POD_UNKNOWN,
    RDMA_UNALLOCATED,
    CniError,
    PodRef,
)


@dataclass(frozen=True)
class PodAnnotations:
    """The pod's annotations and, when known, its UID (from CNI_ARGS or the API)."""

    annotations: Mapping[str, str]
    uid: str
    source: str  # "runtime" or "api"


def read_annotations(
    pod: PodRef, passed: Mapping[str, str] | None, kubeconfig: str | None, timeout: float
) -> PodAnnotations:
    """The pod's annotations: as the runtime passed them, else from the API."""
    if passed is not None and (pod.uid or not kubeconfig):
        return PodAnnotations(passed, pod.uid, "runtime")
    if not kubeconfig:
        raise CniError(
            INVALID_CONFIG,
            f"pod {pod}: the runtime passed no pod annotations and the config names no kubeconfig "
            "to read them (declare capability io.kubernetes.cri.pod-annotations; containerd passes "
            "none for a sandbox without annotations, which kubelet never sends)",
        )
    from kubernetes import client  # imported only when needed: it is slow to import
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from kubegpu.cliargs import UsageError
    from kubegpu.kube import api_client

    try:
        api = api_client(kubeconfig, flag="kubeconfig")
        assert api is not None
        found = client.CoreV1Api(api).read_namespaced_pod(pod.name, pod.namespace, _request_timeout=timeout)
    except ApiException as error:
        raise CniError(POD_UNKNOWN, f"pod {pod}: the API answered {error.status} {error.reason}") from None
    except (UsageError, HTTPError, OSError) as error:
        raise CniError(POD_UNKNOWN, f"pod {pod}: cannot read it from the API: {error}") from None
    uid = str(found.metadata.uid or "")
    if pod.uid and uid != pod.uid:
        raise CniError(POD_UNKNOWN, f"pod {pod}: the API has UID {uid}, the runtime's sandbox {pod.uid}")
    annotations = dict(found.metadata.annotations or {})
    if passed is not None:
        annotations = dict(passed)  # the runtime's copy is the sandbox's own; the API gave the UID
    return PodAnnotations(annotations, uid, "api")


def decide(
    pod: PodRef, found: PodAnnotations, keys: Mapping[str, object], node_name: str
) -> tuple[RdmaInterface, ...]:
    """The VFs the pod holds on this node (empty: nothing to attach), or CniError:
    ALLOCATION_REJECTED when its allocation is unsigned, badly signed, or meant for another pod or
    node; RDMA_UNALLOCATED when the pod asks for RDMA interfaces (``kubegpu.io/rdma-interfaces``,
    as the shim reads it) and carries no allocation, or one without ``rdma``. ``keys`` are read
    only when the pod carries an allocation."""
    value = found.annotations.get(ANNOTATION)
    if value is None:
        _refuse_unallocated(pod, found, "carries no kubegpu allocation")
        return ()
    try:
        allocation = verify(value, keys)  # type: ignore[arg-type]
    except AllocationError as error:
        raise CniError(ALLOCATION_REJECTED, f"pod {pod}: {error}") from None
    misplaced = allocation.misplaced(node_name, found.uid or None)
    if misplaced is not None:
        raise CniError(ALLOCATION_REJECTED, f"pod {pod}: {misplaced}")
    if not found.uid:
        raise CniError(
            ALLOCATION_REJECTED,
            f"pod {pod}: no pod UID to check the allocation against (CNI_ARGS has no K8S_POD_UID; "
            "give the config a kubeconfig)",
        )
    if not allocation.rdma:
        _refuse_unallocated(pod, found, "its allocation holds none")
    return allocation.rdma


def _refuse_unallocated(pod: PodRef, found: PodAnnotations, why: str) -> None:
    """CniError(RDMA_UNALLOCATED) when the pod's annotations ask for RDMA interfaces: it was not
    scheduled by kubegpu (or its allocation was replaced), and would start without them."""
    if asks_rdma(found.annotations):
        asked = str(found.annotations.get(RDMA_INTERFACES_ANNOTATION))[:64]
        raise CniError(
            RDMA_UNALLOCATED,
            f"pod {pod}: asks for RDMA interfaces ({RDMA_INTERFACES_ANNOTATION}={asked!r}) but {why} "
            "(was it scheduled by kubegpu?)",
        )


def node_keys(keys_dir: str) -> Mapping[str, object]:
    """The node's public allocation keys (the directory's trust rules as for the shim)."""
    return KeyRing(Path(keys_dir)).keys()
