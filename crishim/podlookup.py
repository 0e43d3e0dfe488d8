"""API-server fallback for a sandbox whose config lacks the allocation annotation.

Only used when kubelet did not copy ``kubegpu.io/allocation`` into the sandbox config. The pod
is read once per UID (cached), off the event loop, with a short timeout. A pod that requests a
managed resource but carries no allocation is refused: it was not scheduled by kubegpu.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from functools import partial

import grpc
from kubernetes import client
from kubernetes.client.rest import ApiException

from crishim.intercept import Rejected
from kubegpu.allocation import ANNOTATION
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim.podlookup")
DEFAULT_RESOURCES = ("nvidia.com/gpu", "kubegpu.io/gpu-memory", "kubegpu.io/gpu-share", "rdma/hca")


def requested_resources(pod: client.V1Pod, managed: Collection[str]) -> list[str]:
    """The managed resource names any container of the pod asks for (limits or requests)."""
    names = set()
    for container in list(pod.spec.containers or []) + list(pod.spec.init_containers or []):
        resources = container.resources
        for table in (resources.limits if resources else None, resources.requests if resources else None):
            names.update(k for k, v in (table or {}).items() if k in managed and str(v) not in ("0", ""))
    return sorted(names)


class ApiPodLookup:
    """Read a pod's allocation annotation from the API server (the shim's slow path)."""

    def __init__(
        self, api: client.CoreV1Api, managed: Collection[str] = DEFAULT_RESOURCES, timeout: float = 3.0
    ) -> None:
        self._api = api
        self._managed = frozenset(managed)
        self._timeout = timeout
        self._cache: dict[str, str | None] = {}

    async def __call__(self, namespace: str, name: str, uid: str) -> str | None:
        if uid in self._cache:
            return self._cache[uid]
        loop = asyncio.get_running_loop()
        read = partial(self._api.read_namespaced_pod, name, namespace, _request_timeout=self._timeout)
        try:
            pod = await loop.run_in_executor(None, read)
        except (ApiException, OSError, ValueError) as error:
            # Without the API we cannot know; the container is created with every device scrubbed.
            log_event(
                log, "pod_lookup.failed", logging.WARNING, pod=f"{namespace}/{name}", error=str(error)[:200]
            )
            return None
        if pod.metadata.uid != uid:
            return None
        value = (pod.metadata.annotations or {}).get(ANNOTATION)
        wants = requested_resources(pod, self._managed)
        if value is None and wants:
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {namespace}/{name} requests {', '.join(wants)} but carries no kubegpu "
                f"allocation (was it scheduled by kubegpu?)",
            )
        self._cache[uid] = value
        if len(self._cache) > 4096:
            self._cache.pop(next(iter(self._cache)))
        return value
