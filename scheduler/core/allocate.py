"""Device allocation inside one chosen node: which GPUs, for a share how much of which GPU, and which
RDMA VFs.

Whole GPUs are chosen topology-aware (``topology.best_gpu_set``). A share goes to the GPU a policy
picks (FGD: the one that fragments least); the default is best fit, the fitting GPU with the least
free milli (lowest index on ties), which keeps whole GPUs whole for later multi-GPU pods. RDMA
interfaces are chosen jointly with whole GPUs: VFs on the PFs beside the GPUs first
(``rdma.choose_vfs``); when the topology-aware set and its interfaces do not all share PCIe
switches, sets among the GPUs beside PFs with room are tried too, and the set that sits nearest its
interfaces wins (GPU topology wishes that are required still hold; preferred ones may yield).
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.rdma import VfGrant, choose_vfs, vf_distance
from scheduler.core.request import ContainerKind, PodRequest, container_gpus
from scheduler.core.state import Allocation, GpuGrant, NodeState
from scheduler.core.topology import best_gpu_set

Vfs = tuple[VfGrant, ...]


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
        if pod.rdma:
            chosen = _nearer_to_nics(pod, node, chosen)
        grants = tuple(GpuGrant(i, node.gpus[i].id, 1000, node.gpus[i].memory_mib) for i in chosen)
    vfs = _vfs_beside(pod, node, [g.index for g in grants]) if pod.rdma else ()
    if vfs is None:
        return None
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
        rdma=vfs,
    )


def _near(node: NodeState, gpus: Iterable[int]) -> tuple[list[str], set[int]]:
    """The ids and the NUMA nodes of these GPU indices."""
    chosen = [node.gpus[i] for i in gpus]
    return [g.id for g in chosen], {g.numa for g in chosen if g.numa >= 0}


def _vfs_beside(pod: PodRequest, node: NodeState, gpus: Iterable[int]) -> Vfs | None:
    """The pod's VFs beside these GPU indices (``rdma.choose_vfs``), or None when the node has too few."""
    return choose_vfs(pod.rdma, node.nics, *_near(node, gpus))


def _joint_cost(pod: PodRequest, node: NodeState, gpus: tuple[int, ...]) -> tuple[int, int] | None:
    """How far apart these GPUs and the VFs they would get sit: (the VFs' distance from the GPUs, the
    GPUs' distance from those VFs' PFs), both 0 on a shared PCIe switch, 1 on a shared NUMA node, 2
    elsewhere, summed; None when the node cannot give the VFs."""
    near = _near(node, gpus)
    vfs = choose_vfs(pod.rdma, node.nics, *near)
    if vfs is None:
        return None
    pfs = [node.nics.pfs[v.pf] for v in vfs]
    switch = frozenset().union(*(pf.gpus for pf in pfs))
    numas = {pf.numa for pf in pfs if pf.numa >= 0}
    far = sum(0 if node.gpus[i].id in switch else 1 if node.gpus[i].numa in numas else 2 for i in gpus)
    return vf_distance(vfs, node.nics, *near), far


def _nearer_to_nics(pod: PodRequest, node: NodeState, chosen: tuple[int, ...]) -> tuple[int, ...]:
    """``chosen``, or a set of as many free GPUs that sits nearer its interfaces (``_joint_cost``).

    Candidates, after ``chosen``: the best set among the free GPUs on the PCIe switch of a PF with
    room, then among those on such a PF's NUMA node, then one set anchored on each free GPU beside
    such a PF (``best_gpu_set``'s ``must``); the first of least cost wins."""
    best_cost = _joint_cost(pod, node, chosen)
    if best_cost is None or best_cost == (0, 0):
        return chosen
    best = chosen
    free = node.free_gpu_indices(pod)
    roomy = [pf for pf in node.nics.pfs.values() if pf.slots(pod.rdma.min_mbps)]
    switch = frozenset().union(*(pf.gpus for pf in roomy))
    numas = {pf.numa for pf in roomy if pf.numa >= 0}
    links = node.links()
    pools: list[tuple[list[int], tuple[int, ...]]] = [
        ([i for i in free if node.gpus[i].id in switch], ()),
        ([i for i in free if node.gpus[i].numa in numas], ()),
    ]
    pools += [(free, (i,)) for i in free if node.gpus[i].id in switch]
    for pool, must in pools:
        if len(pool) < pod.whole_gpus:
            continue
        candidate = best_gpu_set(links, pool, pod.whole_gpus, pod.topology, must=must)
        if candidate is None or tuple(candidate) == best:
            continue
        cost = _joint_cost(pod, node, tuple(candidate))
        if cost is not None and cost < best_cost:
            best, best_cost = tuple(candidate), cost
            if cost == (0, 0):
                break
    return best


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
