"""API-server fallback for a sandbox whose config lacks the allocation annotation.

Only used when kubelet did not copy ``kubegpu.io/allocation`` into the sandbox config. The pod
is read once per UID (cached), off the event loop, with a short timeout. A pod that asks for
managed devices (a resource in ``kubegpu.allocation.MANAGED_RESOURCES`` or a share annotation in
``SHARE_ANNOTATIONS``) but carries no allocation is refused: it was not scheduled by kubegpu.
When the API server cannot answer, whatever the error, the lookup says "no allocation": the
container is created with every device scrubbed. Static pods never get here (the rewriter knows
them by kubelet's ``kubernetes.io/config.source``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from functools import partial

import grpc
from kubernetes import client

from crishim.intercept import Rejected
from kubegpu.allocation import ANNOTATION, MANAGED_RESOURCES, SHARE_ANNOTATIONS
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim.podlookup")


def requested_resources(pod: client.V1Pod, managed: Collection[str]) -> list[str]:
    """The managed resource names any container of the pod asks for (limits or requests)."""
    names = set()
    for container in list(pod.spec.containers or []) + list(pod.spec.init_containers or []):
        resources = container.resources
        for table in (resources.limits if resources else None, resources.requests if resources else None):
            names.update(k for k, v in (table or {}).items() if k in managed and str(v) not in ("0", ""))
    return sorted(names)


def device_requests(pod: client.V1Pod, managed: Collection[str]) -> list[str]:
    """How the pod asks for managed devices: resource names and share annotations."""
    asked = [a for a in SHARE_ANNOTATIONS if a in (pod.metadata.annotations or {})]
    return requested_resources(pod, managed) + asked


class ApiPodLookup:
    """Read a pod's allocation annotation from the API server (the shim's slow path)."""

    def __init__(
        self, api: client.CoreV1Api, managed: Collection[str] = MANAGED_RESOURCES, timeout: float = 3.0
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
        except Exception as error:  # ApiException, urllib3's MaxRetryError, timeouts, bad answers
            # Without the API we cannot know; the container is created with every device scrubbed.
            log_event(
                log, "pod_lookup.failed", logging.WARNING, pod=f"{namespace}/{name}", error=str(error)[:200]
            )
            return None
        if pod.metadata.uid != uid:
            return None
        value = (pod.metadata.annotations or {}).get(ANNOTATION)
        wants = device_requests(pod, self._managed)
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
