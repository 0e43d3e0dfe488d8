"""Turn a Pod (as the API's JSON, a dict) into the core's ``PodRequest``; bad input gets a message.

The live scheduler works on plain JSON dicts from list/watch: the Kubernetes client's model
deserialisation costs about a millisecond per pod, more than scheduling it.

What a pod can ask for (docs/scheduler.md is the user-facing description):
- whole GPUs: ``resources.limits["nvidia.com/gpu"]`` per container (the name is configurable);
- a share of one GPU: annotation ``kubegpu.io/gpu-milli`` (1..999) and/or
  ``kubegpu.io/gpu-memory-mib``, each in ASCII decimal digits; the share goes to the containers
  named in ``kubegpu.io/gpu-containers`` (comma separated, no empty name), by default the first
  container;
  ``kubegpu.io/gpu-share-enforced: "true"`` places the share only on a GPU whose node enforces
  shares (MPS, docs/gpu-sharing.md);
- GPU models: annotation ``kubegpu.io/gpu-model``, models separated by ``|``;
- RDMA interfaces for the whole pod (SR-IOV VFs): annotation ``kubegpu.io/rdma-interfaces`` (a
  count 0..32 in ASCII decimal digits) or the extended resource ``kubegpu.io/rdma`` (the pod's
  effective request by Kubernetes' rule, below; both given must agree), and
  ``kubegpu.io/rdma-bandwidth`` per interface (``25Gbps``, ``500Mbps`` or ``25Gbps-50Gbps``: minimum
  reserved, maximum; ``kubegpu.bandwidth.parse_bandwidth``);
- topology of a multi-GPU set: annotation ``kubegpu.io/topology``, comma-separated
  ``nvlink``/``numa``/``pcie-switch`` each ``=require`` or ``=prefer``;
- every resource by Kubernetes' rule (``pod_resources``, component-helpers' ``PodRequests``): per
  container its request, else its limit (the apiserver's defaulting); the larger of the app
  containers plus the restartable (sidecar) init containers, and each regular init container plus
  the sidecars declared before it; pod-level resources (``spec.resources``, PodLevelResources) replace
  that for CPU, memory and hugepages, with the apiserver's defaulting of pod-level requests; then
  ``spec.overhead`` is added. CPU is read in milli-units, memory in bytes (exact; ``memory_mib`` rounds
  up, for scores), ``ephemeral-storage``, ``hugepages-*`` and extended resources (any name with a
  ``/``, ``kubegpu.io/rdma`` included) into ``PodRequest.resources``; the GPU resource is counted
  apart (whole GPUs);
- host ports (``hostPort`` of the app containers and the sidecars, with protocol and host IP),
  kube-scheduler's NodePorts;
- node selector, tolerations;
- placement rules (``scheduler.core.constraints``): node affinity, pod affinity and anti-affinity,
  topology spread constraints, priority and preemption policy, with Kubernetes' semantics.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from kubegpu.allocation import RDMA_RESOURCE  # the extended resource the advertiser publishes (VFs)
from kubegpu.bandwidth import parse_bandwidth
from scheduler.core.constraints import SpecError
from scheduler.core.placement import placement_of
from scheduler.core.rdma import MAX_INTERFACES, NO_RDMA, RdmaRequest
from scheduler.core.request import (
    ContainerKind,
    ContainerRequest,
    HostPort,
    PodRequest,
    Toleration,
    TopologyWish,
    Wish,
    container_gpus,
    effective_request,
    resource_tuple,
)

GPU_MILLI_ANNOTATION = "kubegpu.io/gpu-milli"
GPU_MEMORY_ANNOTATION = "kubegpu.io/gpu-memory-mib"
GPU_CONTAINERS_ANNOTATION = "kubegpu.io/gpu-containers"
SHARE_ENFORCED_ANNOTATION = "kubegpu.io/gpu-share-enforced"
GPU_MODEL_ANNOTATION = "kubegpu.io/gpu-model"
TOPOLOGY_ANNOTATION = "kubegpu.io/topology"
RDMA_INTERFACES_ANNOTATION = "kubegpu.io/rdma-interfaces"
RDMA_BANDWIDTH_ANNOTATION = "kubegpu.io/rdma-bandwidth"
TOPOLOGY_KEYS = {"nvlink": "nvlink", "numa": "same_numa", "pcie-switch": "same_pcie_switch"}
MEBI = Decimal(1024 * 1024)


class PodSpecError(ValueError):
    """The pod's kubegpu request is malformed; the message is meant for a FailedScheduling Event."""


# Kubernetes keeps a quantity's value in an int64 of milli-units; beyond it a number is not a quantity
# a node could have or a pod could ask for (and would overflow the core's int64 arrays).
MAX_QUANTITY = Decimal((1 << 63) - 1) / 1000


def _quantity(value: Any, what: str) -> Decimal:
    try:
        quantity = Decimal(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        raise PodSpecError(f"invalid quantity {value!r} for {what}") from None
    if not quantity.is_finite() or abs(quantity) > MAX_QUANTITY:
        raise PodSpecError(
            f"invalid quantity {value!r} for {what}: not a finite number within int64 milli-units"
        )
    return quantity


def _resources(container: Mapping[str, Any]) -> tuple[Any, Any]:
    """A container's raw ``requests`` and ``limits`` (None when absent); PodSpecError when its
    ``resources`` is not an object."""
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise PodSpecError(f"resources of container {container.get('name', '?')} must be an object")
    return resources.get("requests"), resources.get("limits")


def _milli_cpu(value: Any) -> int:
    return int((_quantity(value, "cpu") * 1000).to_integral_value(rounding="ROUND_CEILING"))


def _ceil(quantity: Decimal) -> int:
    """A quantity's ``Value()``: the integer at or above it."""
    return int(quantity.to_integral_value(rounding="ROUND_CEILING"))


def is_scalar_resource(name: str) -> bool:
    """kube-scheduler's ``IsScalarResourceName``: extended resources (a name with a domain, such as
    ``example.com/foo``), ``hugepages-*``, ``attachable-volumes-*`` and prefixed native resources."""
    return "/" in name or name.startswith(("hugepages-", "attachable-volumes-"))


def is_pod_level_resource(name: str) -> bool:
    """What pod-level resources (``spec.resources``) may set: CPU, memory and hugepages."""
    return name in ("cpu", "memory") or name.startswith("hugepages-")


def checked_resource(name: str, gpu_resource: str) -> bool:
    """A resource NodeResourcesFit checks beyond CPU and the pod count, and kubegpu counts in
    ``PodRequest.resources`` (the GPU resource is counted apart, as whole GPUs)."""
    return name != gpu_resource and (name in ("memory", "ephemeral-storage") or is_scalar_resource(name))


def _resource_list(raw: Any, what: str) -> dict[str, Decimal]:
    """A ResourceList (name -> quantity) read exactly; raises PodSpecError naming ``what``."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise PodSpecError(f"{what} must be an object of quantities")
    out = {}
    for name, value in raw.items():
        quantity = _quantity(value, f"{name} of {what}")
        if quantity < 0:
            raise PodSpecError(f"{name} of {what} must not be negative, got {value}")
        out[str(name)] = quantity
    return out


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    """A container's requests, each defaulted from its limit when not given (the apiserver's rule)."""
    raw_requests, raw_limits = _resources(container)
    what = f"container {container.get('name', '?')}"
    requests = _resource_list(raw_requests, what)
    for name, limit in _resource_list(raw_limits, what).items():
        requests.setdefault(name, limit)
    return requests


RESIZE_PENDING = "PodResizePending"  # the pod condition whose reason ``Infeasible`` refuses a resize


def _reported(raw: Any) -> dict[str, Decimal]:
    """A ResourceList the kubelet reported in a container status; an entry that is no non-negative
    quantity is left out (a status is the kubelet's report, never the pod's error)."""
    out: dict[str, Decimal] = {}
    if isinstance(raw, Mapping):
        for name, value in raw.items():
            try:
                quantity = _quantity(value, str(name))
            except PodSpecError:
                continue
            if quantity >= 0:
                out[str(name)] = quantity
    return out


def container_statuses(pod: Mapping[str, Any]) -> dict[str, tuple[dict[str, Decimal], dict[str, Decimal]]]:
    """Per container (app or init) whose status reports its resources: the requests it runs with
    (``status.resources.requests``) and those the kubelet allocated (``allocatedResources``)."""
    status = pod.get("status")
    out: dict[str, tuple[dict[str, Decimal], dict[str, Decimal]]] = {}
    if not isinstance(status, Mapping):
        return out
    for key in ("containerStatuses", "initContainerStatuses"):
        entries = status.get(key)
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("resources"), Mapping):
                continue
            requests = _reported(entry["resources"].get("requests"))
            out[str(entry.get("name", ""))] = (requests, _reported(entry.get("allocatedResources")))
    return out


def resize_infeasible(pod: Mapping[str, Any]) -> bool:
    """Whether the kubelet refused the pod's resize (condition PodResizePending, reason Infeasible)."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, Mapping) and condition.get("type") == RESIZE_PENDING:
            return condition.get("reason") == "Infeasible"
    return False


def status_key(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What ``pod_resources`` reads of a pod's status (a hashable key, to memoise on)."""
    reported = sorted(
        (name, tuple(sorted(running.items())), tuple(sorted(allocated.items())))
        for name, (running, allocated) in container_statuses(pod).items()
    )
    return resize_infeasible(pod), tuple(reported)


def _running_requests(
    spec: dict[str, Decimal], reported: tuple[dict[str, Decimal], dict[str, Decimal]], infeasible: bool
) -> dict[str, Decimal]:
    """A container's requests while it may be resized in place (InPlacePodVerticalScaling, as
    component-helpers with ``UseStatusResources``): per resource the largest of its spec, what it
    runs with and what was allocated; the spec left out when the kubelet refused the resize."""
    out = {} if infeasible else dict(spec)
    for figures in reported:
        for name, value in figures.items():
            if name not in out or value > out[name]:
                out[name] = value
    return out


def _aggregate(rows: list[tuple[ContainerKind, dict[str, Decimal]]]) -> dict[str, Decimal]:
    """Per resource named by any container, the pod's request by the init/sidecar rule."""
    names = {name for _, requests in rows for name in requests}
    total = {}
    for name in names:
        app = [requests.get(name, Decimal(0)) for kind, requests in rows if kind == ContainerKind.APP]
        init = [
            (requests.get(name, Decimal(0)), kind == ContainerKind.SIDECAR)
            for kind, requests in rows
            if kind != ContainerKind.APP
        ]
        total[name] = Decimal(effective_request(app, init))
    return total


def _pod_level(spec: Mapping[str, Any], containers: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """The pod-level requests that replace the containers' aggregate (``spec.resources``), after the
    apiserver's defaulting: hugepages limits from the containers', then requests of CPU and memory
    from the containers' aggregate, then any request from its pod-level limit."""
    raw = spec.get("resources")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise PodSpecError("spec.resources must be an object")
    requests = _resource_list(raw.get("requests"), "spec.resources.requests")
    limits = _resource_list(raw.get("limits"), "spec.resources.limits")
    if requests or limits:
        for name, value in containers.items():
            if name.startswith("hugepages-") and name not in requests:
                limits.setdefault(name, value)
    if limits:
        for name, value in containers.items():
            if name in ("cpu", "memory"):
                requests.setdefault(name, value)
        for name, value in limits.items():
            if is_pod_level_resource(name):
                requests.setdefault(name, value)
    if not any(is_pod_level_resource(name) for name in requests):
        return {}
    return {name: value for name, value in requests.items() if is_pod_level_resource(name)}


def _host_port(port: Any, container: str, host_network: bool) -> HostPort | None:
    """One ``ports[]`` entry as the host port it binds (None: none; a host-network pod binds its
    container port, the apiserver's defaulting)."""
    if not isinstance(port, Mapping):
        raise PodSpecError(f"a port of container {container} must be an object")
    number = port.get("hostPort") or (port.get("containerPort") if host_network else 0) or 0
    protocol, ip = port.get("protocol") or "", port.get("hostIP") or ""
    if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= 65535:
        raise PodSpecError(f"hostPort of container {container} is not a port number: {number!r}"[:200])
    if not isinstance(protocol, str) or not isinstance(ip, str):
        raise PodSpecError(f"protocol and hostIP of container {container}'s ports must be strings")
    return HostPort.of(number, protocol, ip) if number else None


def _host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """The host ports of the app containers and the sidecars (kube-scheduler's ``GetHostPorts``:
    regular init containers do not count)."""
    host_network = bool(spec.get("hostNetwork"))
    out = []
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            if key == "initContainers" and c.get("restartPolicy") != "Always":
                continue
            for port in c.get("ports") or []:
                entry = _host_port(port, str(c.get("name", "?")), host_network)
                if entry is not None:
                    out.append(entry)
    return tuple(out)


def _gpus(container: Mapping[str, Any], resource: str) -> int:
    # a list that is not an object counts no GPUs here; _container_requests refuses it with its message
    requests, limits = (raw if isinstance(raw, Mapping) else {} for raw in _resources(container))
    value = limits.get(resource, requests.get(resource, 0))
    name = container.get("name", "?")
    count = _quantity(value, f"{resource} of container {name}")
    if count < 0 or count != count.to_integral_value():
        raise PodSpecError(f"{resource} of container {name} must be a whole number, got {value}")
    return int(count)


def _kind(container: Mapping[str, Any], init: bool) -> ContainerKind:
    if not init:
        return ContainerKind.APP
    return ContainerKind.SIDECAR if container.get("restartPolicy") == "Always" else ContainerKind.INIT


@dataclass(frozen=True)
class PodResources:
    """What a pod requests of its node by Kubernetes' rule (``pod_resources``)."""

    cpu_milli: int
    memory_mib: int  # the memory request rounded up to MiB (scores; the check is in bytes)
    containers: tuple[ContainerRequest, ...]  # in pod order, with their whole GPUs
    resources: tuple[tuple[str, int], ...] = ()  # memory in bytes and the other checked resources
    host_ports: tuple[HostPort, ...] = ()


def pod_resources(pod: Mapping[str, Any], gpu_resource: str) -> PodResources:
    """What a pod requests, by Kubernetes' rule (component-helpers' ``PodRequests`` over the
    containers, pod-level resources and overhead; the scheduler's rounding: CPU up to a milli-unit,
    anything else up to a whole unit).

    The containers come in pod order (init containers, then app containers); the pod's GPU count is
    ``request.container_gpus`` of them. Raises PodSpecError for a malformed quantity or port.
    """
    spec = pod.get("spec") or {}
    rows: list[tuple[ContainerKind, dict[str, Decimal]]] = []
    containers = []
    statuses = container_statuses(pod)
    infeasible = resize_infeasible(pod) if statuses else False
    for init, key in ((True, "initContainers"), (False, "containers")):
        for c in spec.get(key) or []:
            kind = _kind(c, init)
            name = str(c.get("name", ""))
            containers.append(ContainerRequest(name, _gpus(c, gpu_resource), kind))
            requests = _container_requests(c)
            if kind != ContainerKind.INIT and name in statuses:
                requests = _running_requests(requests, statuses[name], infeasible)
            rows.append((kind, requests))
    total = _aggregate(rows)
    total.update(_pod_level(spec, total))
    for name, value in _resource_list(spec.get("overhead"), "spec.overhead").items():
        total[name] = total.get(name, Decimal(0)) + value
    for name, value in total.items():
        if value > MAX_QUANTITY:
            raise PodSpecError(f"the pod's {name} request ({value}) is beyond what Kubernetes keeps")
    memory = total.get("memory", Decimal(0))
    return PodResources(
        cpu_milli=_ceil(total.get("cpu", Decimal(0)) * 1000),
        memory_mib=_ceil(memory / MEBI),
        containers=tuple(containers),
        resources=resource_tuple(
            (name, _ceil(value)) for name, value in total.items() if checked_resource(name, gpu_resource)
        ),
        host_ports=_host_ports(spec),
    )


# A share's figure: ASCII digits, at most spaces or tabs around them. Not int()'s reading, which
# takes "1_00", "+100" and Unicode digits ("١٠٠"), nor a quantity ("1e2", "100m").
DECIMAL = re.compile(r"[ \t]*([0-9]+)[ \t]*")
MAX_DIGITS = 18  # below int64; every range checked here is far smaller


def _int_annotation(annotations: Mapping[str, str], key: str, low: int, high: int) -> int:
    """The annotation's whole number in ``low..high`` (0 when absent); PodSpecError naming the value."""
    raw = annotations.get(key)
    if raw is None:
        return 0
    match = DECIMAL.fullmatch(raw) if isinstance(raw, str) else None
    if match is None:
        raise PodSpecError(f"annotation {key}={raw!r} is not a whole number in decimal digits (0-9)")
    digits = match.group(1).lstrip("0") or "0"
    value = int(digits) if len(digits) <= MAX_DIGITS else high + 1
    if not low <= value <= high:
        raise PodSpecError(f"annotation {key}={raw.strip()} is outside {low}..{high}")
    return value


def _share_containers(annotations: Mapping[str, str], names: list[str]) -> list[str]:
    """The app containers ``kubegpu.io/gpu-containers`` names (comma separated, spaces around a
    name allowed); absent: the first container. An empty name (``""``, ``","``, ``"a,,b"``) or an
    unknown one is a PodSpecError."""
    raw = annotations.get(GPU_CONTAINERS_ANNOTATION)
    if raw is None:
        return names[:1]
    wanted = [n.strip() for n in raw.split(",")] if isinstance(raw, str) else [""]
    if "" in wanted:
        raise PodSpecError(
            f"annotation {GPU_CONTAINERS_ANNOTATION}={raw!r} names an empty container"
            " (give container names separated by single commas)"
        )
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise PodSpecError(
            f"annotation {GPU_CONTAINERS_ANNOTATION} names unknown containers {unknown}"
            " (a share goes to app containers only)"
        )
    return wanted


def _bool_annotation(annotations: Mapping[str, str], key: str) -> bool:
    raw = annotations.get(key)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise PodSpecError(f"annotation {key}={raw!r} is not true or false")
    return value == "true"


def rdma_request(annotations: Mapping[str, str], resource: int = 0) -> RdmaRequest:
    """The pod's RDMA interfaces from ``kubegpu.io/rdma-interfaces`` and ``kubegpu.io/rdma-bandwidth``,
    or from ``resource``: the pod's effective request of the extended resource ``kubegpu.io/rdma``
    (``pod_resources``; 0: not asked), which asks for that many interfaces exactly as the annotation.

    Neither: none (a bandwidth alone is a PodSpecError, as it asks for nothing). ``"0"`` asks for
    none whatever the bandwidth says. The bandwidth is optional (nothing reserved). The annotation
    and a non-zero resource request that disagree are a PodSpecError naming both.
    """
    if RDMA_INTERFACES_ANNOTATION in annotations:
        count = _int_annotation(annotations, RDMA_INTERFACES_ANNOTATION, 0, MAX_INTERFACES)
        if resource and count != resource:
            raise PodSpecError(
                f"annotation {RDMA_INTERFACES_ANNOTATION}={annotations[RDMA_INTERFACES_ANNOTATION]!r}"[:200]
                + f" and resource {RDMA_RESOURCE}={resource} (the pod's request) disagree:"
                " give one, or both with the same count"
            )
    elif resource:
        if resource > MAX_INTERFACES:
            raise PodSpecError(
                f"resource {RDMA_RESOURCE}={resource} (the pod's request) is more than"
                f" {MAX_INTERFACES} RDMA interfaces"
            )
        count = resource
    else:
        if RDMA_BANDWIDTH_ANNOTATION in annotations:
            raise PodSpecError(
                f"annotation {RDMA_BANDWIDTH_ANNOTATION} needs {RDMA_INTERFACES_ANNOTATION}"
                f" or resource {RDMA_RESOURCE} (how many interfaces)"
            )
        return NO_RDMA
    raw = annotations.get(RDMA_BANDWIDTH_ANNOTATION)
    low = high = 0
    if raw is not None:
        try:
            low, high = parse_bandwidth(raw)
        except ValueError as error:
            raise PodSpecError(f"annotation {RDMA_BANDWIDTH_ANNOTATION}: {error}") from None
    return RdmaRequest(count, low, high) if count else NO_RDMA


def parse_topology(raw: str | None) -> TopologyWish:
    """``nvlink=require,numa=prefer`` -> TopologyWish."""
    if not raw:
        return TopologyWish()
    wishes: dict[str, Wish] = {}
    for part in raw.split(","):
        key, _, level = part.strip().partition("=")
        if key not in TOPOLOGY_KEYS or level not in ("require", "prefer"):
            raise PodSpecError(
                f"annotation {TOPOLOGY_ANNOTATION}: {part.strip()!r} is not one of "
                f"{', '.join(TOPOLOGY_KEYS)} =require|prefer"
            )
        wishes[TOPOLOGY_KEYS[key]] = Wish.REQUIRE if level == "require" else Wish.PREFER
    return TopologyWish(**wishes)


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    raw = spec.get("tolerations") or []
    if not isinstance(raw, list):
        raise PodSpecError("spec.tolerations must be a list")
    out = []
    for i, t in enumerate(raw):
        where = f"spec.tolerations[{i}]"
        if not isinstance(t, Mapping):
            raise PodSpecError(f"{where} must be an object")
        fields = {}
        for name in ("key", "operator", "value", "effect"):
            value = t.get(name) or ""
            if not isinstance(value, str):
                raise PodSpecError(f"{where}.{name} must be a string, got {value!r}"[:200])
            fields[name] = value
        fields["operator"] = fields["operator"] or "Equal"
        if fields["operator"] not in ("Equal", "Exists"):
            raise PodSpecError(f"{where}.operator must be Equal or Exists, got {fields['operator']!r}"[:200])
        out.append(Toleration(**fields))
    return tuple(out)


def pod_request(pod: Mapping[str, Any], gpu_resource: str = "nvidia.com/gpu") -> PodRequest:
    """The scheduling request of a pod (API JSON); raise PodSpecError with a user-facing message."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    containers = list(spec.get("containers") or [])
    if not containers:
        raise PodSpecError("pod has no containers")
    asked = pod_resources(pod, gpu_resource)
    rows = asked.containers
    milli = _int_annotation(annotations, GPU_MILLI_ANNOTATION, 1, 999)
    gpu_memory = _int_annotation(annotations, GPU_MEMORY_ANNOTATION, 1, 1 << 24)
    sharing = bool(milli or gpu_memory)
    enforced = _bool_annotation(annotations, SHARE_ENFORCED_ANNOTATION)
    if enforced and not sharing:
        raise PodSpecError(
            f"annotation {SHARE_ENFORCED_ANNOTATION} needs a GPU share "
            f"({GPU_MILLI_ANNOTATION} or {GPU_MEMORY_ANNOTATION}); whole GPUs are never shared"
        )
    if sharing and any(c.gpu_count for c in rows):
        raise PodSpecError(f"a pod asks for whole GPUs ({gpu_resource}) or a share of one GPU, not both")
    if sharing:
        wanted = _share_containers(annotations, [str(c.get("name", "")) for c in containers])
        container_requests = tuple(
            ContainerRequest(c.name, 1 if c.kind == ContainerKind.APP and c.name in wanted else 0, c.kind)
            for c in rows
        )
        gpu_count = 1
    else:
        container_requests = rows
        gpu_count = container_gpus(rows)
    models = frozenset(m.strip() for m in annotations.get(GPU_MODEL_ANNOTATION, "").split("|") if m.strip())
    rdma = rdma_request(annotations, dict(asked.resources).get(RDMA_RESOURCE, 0))
    tolerations = _tolerations(spec)
    try:
        placement = placement_of(pod, tolerations)
    except SpecError as error:
        raise PodSpecError(str(error)) from None
    try:
        return PodRequest(
            name=name,
            uid=meta.get("uid") or name,
            cpu_milli=asked.cpu_milli,
            memory_mib=asked.memory_mib,
            gpu_count=gpu_count,
            gpu_milli=milli if sharing else 0,
            gpu_memory_mib=gpu_memory,
            gpu_models=models,
            enforced_share=enforced,
            topology=parse_topology(annotations.get(TOPOLOGY_ANNOTATION)),
            node_selector=dict(spec.get("nodeSelector") or {}),
            tolerations=tolerations,
            containers=container_requests,
            resources=asked.resources,
            host_ports=asked.host_ports,
            rdma=rdma,
            placement=placement,
        )
    except ValueError as error:
        raise PodSpecError(str(error)) from None
