"""Device allocation inside one chosen node: which GPUs, and for a share how much of which GPU.

Whole GPUs are chosen topology-aware (``topology.best_gpu_set``). A share goes to the GPU a policy
picks (FGD: the one that fragments least); the default is best fit, the fitting GPU with the least
free milli (lowest index on ties), which keeps whole GPUs whole for later multi-GPU pods.
"""

from __future__ import annotations

from scheduler.core.request import ContainerKind, PodRequest, container_gpus
from scheduler.core.state import Allocation, GpuGrant, NodeState
from scheduler.core.topology import best_gpu_set


def best_fit_share_gpu(pod: PodRequest, node: NodeState) -> int | None:
    """The fitting GPU with the least free milli (lowest index on ties), or None."""
    best: int | None = None
    for gpu in node.gpus:
        if gpu.fits_share(pod) and (best is None or gpu.free_milli < node.gpus[best].free_milli):
            best = gpu.index
    return best


def choose_whole_gpus(pod: PodRequest, node: NodeState) -> tuple[int, ...] | None:
    """The best set of ``pod.whole_gpus`` fully free GPUs, or None if there is none."""
    free = node.free_gpu_indices(pod)
    return best_gpu_set(node.links(), free, pod.whole_gpus, pod.topology)


def allocate(pod: PodRequest, node: NodeState, share_gpu: int | None = None) -> Allocation | None:
    """The allocation of ``pod`` on ``node`` (``share_gpu`` overrides the share's GPU), or None."""
    grants: tuple[GpuGrant, ...] = ()
    if pod.is_share:
        index = share_gpu if share_gpu is not None else best_fit_share_gpu(pod, node)
        if index is not None and not node.gpus[index].fits_share(pod):
            # A policy's pick that does not fit (it scores free milli; an enforced share must also
            # land on a GPU that enforces shares): the best fit among the GPUs that do.
            index = best_fit_share_gpu(pod, node)
        if index is None:
            return None
        gpu = node.gpus[index]
        milli, memory = gpu.share_for(pod)
        grants = (GpuGrant(index, gpu.id, milli, memory),)
    elif pod.gpu_count:
        chosen = choose_whole_gpus(pod, node)
        if chosen is None:
            return None
        grants = tuple(GpuGrant(i, node.gpus[i].id, 1000, node.gpus[i].memory_mib) for i in chosen)
    return Allocation(
        node=node.name,
        pod_uid=pod.uid,
        pod_name=pod.name,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpus=grants,
        containers=split_containers(pod, grants),
        gpu_tag=pod.gpu_tag,
        init_containers=frozenset(c.name for c in pod.containers if c.kind == ContainerKind.INIT),
        resources=pod.resources,
        host_ports=pod.host_ports,
    )


def split_containers(pod: PodRequest, grants: tuple[GpuGrant, ...]) -> dict[str, tuple[str, ...]]:
    """Container -> device ids.

    Whole GPUs are laid out so that containers running at the same time never share one: the
    sidecars (restartable init containers) take the first GPUs in declaration order, the app
    containers the next ones in order, and each regular init container starts right after the
    sidecars declared before it (it runs alone with them, before the app containers start, so it
    reuses GPUs the app containers get later). That needs exactly Kubernetes' pod request of GPUs
    (``request.container_gpus``). A share goes to the containers that ask for it (``gpu_count`` 1),
    or to every app container when none says.
    """
    if not pod.containers or not grants:
        return {}
    if pod.is_share:
        takers = [c.name for c in pod.containers if c.gpu_count] or [
            c.name for c in pod.containers if c.kind == ContainerKind.APP
        ]
        return {name: (grants[0].id,) for name in takers}
    ids = [g.id for g in grants]
    need = container_gpus(pod.containers)
    if need != len(ids):
        raise ValueError(f"pod {pod.name}: its containers need {need} GPUs, not {len(ids)}")
    sidecars = sum(c.gpu_count for c in pod.containers if c.kind == ContainerKind.SIDECAR)
    out: dict[str, tuple[str, ...]] = {}
    sidecar_at, app_at = 0, sidecars
    for c in pod.containers:
        if c.kind == ContainerKind.SIDECAR:
            start = sidecar_at
            sidecar_at += c.gpu_count
        elif c.kind == ContainerKind.INIT:
            start = sidecar_at  # the sidecars declared so far are running beside it
        else:
            start = app_at
            app_at += c.gpu_count
        if c.gpu_count:
            out[c.name] = tuple(ids[start : start + c.gpu_count])
    return out
