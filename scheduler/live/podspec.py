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
- topology of a multi-GPU set: annotation ``kubegpu.io/topology``, comma-separated
  ``nvlink``/``numa``/``pcie-switch`` each ``=require`` or ``=prefer``;
- CPU, memory and whole GPUs by Kubernetes' rule (``pod_resources``): the larger of the app
  containers plus the restartable (sidecar) init containers, and each regular init container plus
  the sidecars declared before it; ``spec.overhead`` is added to CPU and memory;
- node selector, tolerations;
- placement rules (``scheduler.core.constraints``): node affinity, pod affinity and anti-affinity,
  topology spread constraints, priority and preemption policy, with Kubernetes' semantics.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from scheduler.core.constraints import SpecError
from scheduler.core.placement import placement_of
from scheduler.core.request import (
    ContainerKind,
    ContainerRequest,
    PodRequest,
    Toleration,
    TopologyWish,
    Wish,
    container_gpus,
    effective_request,
)

GPU_MILLI_ANNOTATION = "kubegpu.io/gpu-milli"
GPU_MEMORY_ANNOTATION = "kubegpu.io/gpu-memory-mib"
GPU_CONTAINERS_ANNOTATION = "kubegpu.io/gpu-containers"
SHARE_ENFORCED_ANNOTATION = "kubegpu.io/gpu-share-enforced"
GPU_MODEL_ANNOTATION = "kubegpu.io/gpu-model"
TOPOLOGY_ANNOTATION = "kubegpu.io/topology"
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


def _resources(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    resources = container.get("resources") or {}
    return resources.get("requests") or {}, resources.get("limits") or {}


def _cpu_memory(container: Mapping[str, Any]) -> tuple[int, int]:
    requests, limits = _resources(container)
    cpu = requests.get("cpu", limits.get("cpu", 0))
    memory = requests.get("memory", limits.get("memory", 0))
    return _milli_cpu(cpu), _mebibytes(memory)


def _milli_cpu(value: Any) -> int:
    return int((_quantity(value, "cpu") * 1000).to_integral_value(rounding="ROUND_CEILING"))


def _mebibytes(value: Any) -> int:
    return int((_quantity(value, "memory") / MEBI).to_integral_value(rounding="ROUND_CEILING"))


def _gpus(container: Mapping[str, Any], resource: str) -> int:
    requests, limits = _resources(container)
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


def pod_resources(pod: Mapping[str, Any], gpu_resource: str) -> tuple[int, int, tuple[ContainerRequest, ...]]:
    """(CPU milli, memory MiB, the containers with their whole GPUs) of a pod, by Kubernetes' rule.

    The containers come in pod order (init containers, then app containers); the pod's GPU count is
    ``request.container_gpus`` of them. Raises PodSpecError for a malformed quantity.
    """
    spec = pod.get("spec") or {}
    rows: list[tuple[ContainerKind, str, int, int, int]] = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for c in spec.get(key) or []:
            cpu, memory = _cpu_memory(c)
            rows.append((_kind(c, init), str(c.get("name", "")), cpu, memory, _gpus(c, gpu_resource)))
    overhead = spec.get("overhead") or {}
    extras = (_milli_cpu(overhead.get("cpu", 0)), _mebibytes(overhead.get("memory", 0)))
    totals = []
    for column, extra in zip((2, 3), extras, strict=True):
        app = [row[column] for row in rows if row[0] == ContainerKind.APP]
        init = [(row[column], row[0] == ContainerKind.SIDECAR) for row in rows if row[0] != ContainerKind.APP]
        totals.append(effective_request(app, init, extra))
    containers = tuple(ContainerRequest(name, gpus, kind) for kind, name, _, _, gpus in rows)
    return totals[0], totals[1], containers


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
    cpu, memory, rows = pod_resources(pod, gpu_resource)
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
    tolerations = _tolerations(spec)
    try:
        placement = placement_of(pod, tolerations)
    except SpecError as error:
        raise PodSpecError(str(error)) from None
    try:
        return PodRequest(
            name=name,
            uid=meta.get("uid") or name,
            cpu_milli=cpu,
            memory_mib=memory,
            gpu_count=gpu_count,
            gpu_milli=milli if sharing else 0,
            gpu_memory_mib=gpu_memory,
            gpu_models=models,
            enforced_share=enforced,
            topology=parse_topology(annotations.get(TOPOLOGY_ANNOTATION)),
            node_selector=dict(spec.get("nodeSelector") or {}),
            tolerations=tolerations,
            containers=container_requests,
            placement=placement,
        )
    except ValueError as error:
        raise PodSpecError(str(error)) from None
