"""The API-server path for a sandbox whose config lacks the allocation annotation.

Only used when kubelet did not copy ``kubegpu.io/allocation`` into the sandbox config: every pod
without devices, and a pod that bypassed the scheduler. A pod that asks for managed devices (a
resource in ``kubegpu.allocation.MANAGED_RESOURCES``, a share annotation in ``SHARE_ANNOTATIONS``
or RDMA interfaces, ``asks_rdma``) but carries no allocation is refused: it was not scheduled by
kubegpu.

Where the pod's facts come from, fastest first:
1. ``NodePodCache``: one list + watch of the pods bound to this node (field selector
   ``spec.nodeName``), kept in memory as the few facts the decision needs. It answers only for a
   pod it has seen, with the same UID, namespace and name.
2. Otherwise a GET of the pod by name, off the event loop, with a short timeout. An unseen pod
   (the watch is behind, not started, broken, or forbidden by RBAC) is always read this way: the
   cache can only spare a read, never skip the check.
When the API server cannot answer, whatever the error, the lookup says "no allocation": the
container is created with every device scrubbed. Static pods never get here (the rewriter knows
them by kubelet's ``kubernetes.io/config.source``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

import grpc
from kubernetes import client, watch
from kubernetes.utils import parse_quantity

from crishim.intercept import Rejected
from kubegpu.allocation import (
    ANNOTATION,
    MANAGED_RESOURCES,
    RDMA_INTERFACES_ANNOTATION,
    RDMA_RESOURCE,
    SHARE_ANNOTATIONS,
    asks_rdma,
)
from kubegpu.kube import shut_response
from kubegpu.logs import log_event
from kubegpu.podrequests import effective_request

log = logging.getLogger("kubegpu.crishim.podlookup")


@dataclass(frozen=True)
class PodFacts:
    """What the shim needs to know about a pod: its identity, allocation and device requests."""

    namespace: str
    name: str
    uid: str
    allocation: str | None
    wants: tuple[str, ...]
    # container name -> (privileged, capabilities added): what the NRI front cannot see itself
    security: Mapping[str, tuple[bool, tuple[str, ...]]] = field(default_factory=dict, hash=False)
    rdma: int = 0  # the pod's request of kubegpu.io/rdma: the RDMA interfaces it asks for that way


def requested_resources(pod: Mapping[str, Any], managed: Collection[str]) -> list[str]:
    """The managed resource names any container of the pod (API JSON) asks for, limits or requests."""
    spec = pod.get("spec") or {}
    names = set()
    for container in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for table in (resources.get("limits"), resources.get("requests")):
            names.update(k for k, v in (table or {}).items() if k in managed and str(v) not in ("0", ""))
    return sorted(names)


def _quantity(value: Any) -> int:
    """A resource quantity rounded up to a whole unit (the scheduler's rounding); 0 when it cannot
    be read (the apiserver admits no such pod)."""
    try:
        return math.ceil(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return 0


def resource_request(pod: Mapping[str, Any], name: str) -> int:
    """The pod's (API JSON) effective request of the extended resource ``name`` by Kubernetes' rule,
    as the scheduler counts it (scheduler/live/podspec.py ``pod_resources``): per container its
    request, else its limit; the app containers and sidecars summed, the larger of that and each
    regular init container with the sidecars before it; plus ``spec.overhead``."""
    spec = pod.get("spec") or {}
    app, init = [], []
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if not isinstance(container, Mapping):
                continue
            resources = container.get("resources") or {}
            requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
            value = _quantity(requests[name] if name in requests else limits.get(name, 0))
            if key == "containers":
                app.append(value)
            else:
                init.append((value, container.get("restartPolicy") == "Always"))
    overhead = _quantity((spec.get("overhead") or {}).get(name, 0))
    return effective_request(app, init, overhead)


def container_security(pod: Mapping[str, Any]) -> dict[str, tuple[bool, tuple[str, ...]]]:
    """Each container's ``securityContext.privileged`` and ``capabilities.add`` (API JSON), for
    every kind of container (init, sidecar, app, ephemeral)."""
    spec = pod.get("spec") or {}
    out: dict[str, tuple[bool, tuple[str, ...]]] = {}
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            if not isinstance(container, Mapping):
                continue
            context = container.get("securityContext") or {}
            capabilities = (context.get("capabilities") or {}).get("add") or []
            added = tuple(str(c) for c in capabilities if isinstance(c, str))
            out[str(container.get("name") or "")] = (context.get("privileged") is True, added)
    return out


def facts_of(pod: Mapping[str, Any], managed: Collection[str]) -> PodFacts:
    """The facts of a pod as the API server returns it (JSON)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    asked = [a for a in SHARE_ANNOTATIONS if a in annotations]
    if isinstance(annotations, Mapping) and asks_rdma(annotations):
        asked.append(RDMA_INTERFACES_ANNOTATION)
    return PodFacts(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        allocation=annotations.get(ANNOTATION),
        wants=tuple(requested_resources(pod, managed) + asked),
        security=container_security(pod),
        rdma=resource_request(pod, RDMA_RESOURCE),
    )


def decide(facts: PodFacts) -> str | None:
    """The pod's allocation (None: none); Rejected when it asks for devices without one."""
    if facts.allocation is None and facts.wants:
        raise Rejected(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"pod {facts.namespace}/{facts.name} requests {', '.join(facts.wants)} but carries no "
            f"kubegpu allocation (was it scheduled by kubegpu?)",
        )
    return facts.allocation


class NodePodCache:
    """The facts of the pods bound to one node, from a list + watch in a background thread.

    ``get`` answers only for a pod seen with that UID, namespace and name; anything else is the
    caller's to read from the API. A watch the server ends is resumed from the last version seen;
    after a broken one the thread lists again (what the list no longer has is dropped). When the
    list itself fails (API down, or RBAC without list/watch on pods) it retries every
    ``retry_seconds`` and the cache answers only for what it saw before.
    """

    WATCH_SECONDS = 240  # the API server ends each watch after this; the thread goes on

    def __init__(
        self,
        api: client.CoreV1Api,
        node: str,
        managed: Collection[str] = MANAGED_RESOURCES,
        retry_seconds: float = 10.0,
    ) -> None:
        self._api = api
        self._node = node
        self._managed = frozenset(managed)
        self._retry_seconds = retry_seconds
        self._pods: dict[str, PodFacts] = {}  # by UID; replaced whole, never mutated in place
        self._stopped = threading.Event()
        self._watch: watch.Watch | None = None
        self._response: Any = None  # the watch's HTTP response in flight
        self._response_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()  # set once a list has succeeded

    def get(self, namespace: str, name: str, uid: str) -> PodFacts | None:
        facts = self._pods.get(uid)
        if facts is None or facts.namespace != namespace or facts.name != name:
            return None
        return facts

    def __len__(self) -> int:
        return len(self._pods)

    def start(self) -> NodePodCache:
        self._thread = threading.Thread(target=self._run, name="kubegpu-pod-cache", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the watch thread: the watch in flight is broken off at once (not left to the
        server's end of it, minutes away), and the thread joined for up to ``timeout`` seconds."""
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()
        with self._response_lock:
            response, self._response = self._response, None
        if response is not None:
            shut_response(response)
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _listing(self) -> Callable[..., Any]:
        """The list call for the watch, remembering its response so that stop() can break it off."""
        list_pods = self._api.list_pod_for_all_namespaces

        @wraps(list_pods)
        def listing(*args: Any, **kwargs: Any) -> Any:
            response = list_pods(*args, **kwargs)
            with self._response_lock:
                if self._stopped.is_set():
                    shut_response(response)
                else:
                    self._response = response
            return response

        return listing

    def _run(self) -> None:
        selector = f"spec.nodeName={self._node}"
        failures = 0
        version: str | None = None
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._list(selector)
                    failures = 0
                version = self._follow(selector, version)
            except Exception as error:  # ApiException (403, 410), connection errors, bad JSON
                if self._stopped.is_set():
                    return  # stop() broke the watch off
                version = None  # list again: events may have been missed
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log_event(
                        log,
                        "pod_cache.failed",
                        logging.WARNING,
                        node=self._node,
                        error=f"{type(error).__name__}: {error}"[:300],
                        note="pods not seen are read from the API server",
                    )
                self._stopped.wait(self._retry_seconds if failures > 1 else 1.0)

    def _list(self, selector: str) -> str:
        response = self._api.list_pod_for_all_namespaces(
            field_selector=selector, _preload_content=False, _request_timeout=30
        )
        listing = json.loads(response.data)
        pods = (facts_of(item, self._managed) for item in listing.get("items") or [])
        self._pods = {facts.uid: facts for facts in pods if facts.uid}
        first = not self.synced.is_set()
        self.synced.set()
        if first:
            log_event(log, "pod_cache.synced", node=self._node, pods=len(self._pods))
        return str(listing["metadata"]["resourceVersion"])

    def _follow(self, selector: str, version: str) -> str:
        """Apply watch events until the server ends the watch; return the last resourceVersion
        seen (the next watch starts there). Raise when the watch breaks: the caller lists again."""
        self._watch = watch.Watch()
        stream = self._watch.stream(
            self._listing(),
            field_selector=selector,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.WATCH_SECONDS,
            _request_timeout=self.WATCH_SECONDS + 30,
            deserialize=False,  # JSON only: the facts are read from the dicts
        )
        for event in stream:  # an ERROR event (410 Gone: our version is too old) raises
            if self._stopped.is_set():
                return version
            kind, pod = event["type"], event["object"]
            version = str(pod["metadata"]["resourceVersion"])
            if kind == "BOOKMARK":
                continue
            facts = facts_of(pod, self._managed)
            pods = dict(self._pods)
            if kind == "DELETED":
                pods.pop(facts.uid, None)
            else:
                pods[facts.uid] = facts
            self._pods = pods
        return version  # the server ended the watch (timeout_seconds); nothing was missed


def _keep(cache: dict[str, Any], uid: str, value: Any, limit: int = 4096) -> None:
    """Remember ``value`` for pod ``uid``, dropping the oldest entry past ``limit``."""
    cache[uid] = value
    if len(cache) > limit:
        cache.pop(next(iter(cache)))


class ApiPodLookup:
    """A pod's allocation annotation, from the node's pod cache or the API server."""

    def __init__(
        self,
        api: client.CoreV1Api,
        managed: Collection[str] = MANAGED_RESOURCES,
        timeout: float = 3.0,
        cache: NodePodCache | None = None,
    ) -> None:
        self._api = api
        self._managed = frozenset(managed)
        self._timeout = timeout
        self._node_pods = cache
        self._cache: dict[str, str | None] = {}
        self._rdma: dict[str, int] = {}

    async def __call__(self, namespace: str, name: str, uid: str) -> str | None:
        if uid in self._cache:
            return self._cache[uid]
        facts = await self.facts(namespace, name, uid)
        if facts is None:
            return None
        value = decide(facts)
        _keep(self._cache, uid, value)
        _keep(self._rdma, uid, facts.rdma)  # the same create asks rdma_resource next: no second read
        return value

    async def rdma_resource(self, namespace: str, name: str, uid: str) -> int | None:
        """The pod's request of ``kubegpu.io/rdma`` (``PodFacts.rdma``), from the node's pod cache or
        a read, kept per UID (a pod's extended resources never change); None when the API cannot
        answer or the pod of that name has another UID."""
        if uid in self._rdma:
            return self._rdma[uid]
        facts = await self.facts(namespace, name, uid)
        if facts is None:
            return None
        _keep(self._rdma, uid, facts.rdma)
        return facts.rdma

    async def facts(self, namespace: str, name: str, uid: str, fresh: bool = False) -> PodFacts | None:
        """The pod's facts from the node's pod cache or a read (None: the API cannot answer, or
        the pod of that name has another UID); ``fresh``: always a read (the cache may be behind)."""
        cache = None if fresh else self._node_pods
        facts = cache.get(namespace, name, uid) if cache is not None else None
        if facts is None:
            facts = await self._read(namespace, name)
        return facts if facts is not None and facts.uid == uid else None

    async def _read(self, namespace: str, name: str) -> PodFacts | None:
        """GET the pod; None when the API server cannot answer within the lookup's timeout (logged).

        The wait is bounded here, not by the HTTP client alone: urllib3 retries a GET whose read
        timed out (three times by default), so a server that accepts and stalls held a container
        create up to four timeouts; the body is read in the worker thread too (not on the loop)."""
        loop = asyncio.get_running_loop()

        def read() -> Any:
            response = self._api.read_namespaced_pod(
                name, namespace, _request_timeout=self._timeout, _preload_content=False
            )
            return json.loads(response.data)

        try:
            doc = await asyncio.wait_for(loop.run_in_executor(None, read), self._timeout)
            return facts_of(doc, self._managed)
        except Exception as error:  # ApiException, urllib3's MaxRetryError, timeouts, bad answers
            # Without the API we cannot know; the container is created with every device scrubbed.
            reason = (
                f"no answer within {self._timeout:g} s" if isinstance(error, TimeoutError) else str(error)
            )
            log_event(
                log, "pod_lookup.failed", logging.WARNING, pod=f"{namespace}/{name}", error=reason[:200]
            )
            return None
