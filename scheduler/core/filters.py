"""Filter plugins: which nodes can take a pod, and why the others cannot.

Each filter works on an array of candidate node indices at once (``keep``) and, for the nodes it
rejects, names the reason (``reasons``). ``unschedulable_message`` aggregates the reasons over all
nodes into the familiar ``0/12 nodes are available: 8 insufficient nvidia.com/gpu, 4 no
NVLink-connected set of 4 GPUs.`` form. Filters run in order and each sees only the nodes the
previous ones kept, so every node is counted under the first filter it fails (CPU and memory are one
filter, like kube-scheduler's NodeResourcesFit, and may name both).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from scheduler.core.affinity import NodeAffinity, PodFacts
from scheduler.core.placement import PASS as PLACEMENT_PASS
from scheduler.core.placement import REASONS as PLACEMENT_REASONS
from scheduler.core.placement import PodPlacement
from scheduler.core.rdma import NO_BANDWIDTH, NO_FREE_VFS
from scheduler.core.request import MILLI, PodRequest, Wish, ports_conflict, tolerates_unschedulable
from scheduler.core.state import ClusterState
from scheduler.core.topology import best_gpu_set

NO_ENFORCING_GPU = "no GPU that enforces shares (MPS)"
# the memory guard: some GPU has room by the books, but its memory in use (live) leaves too little
LIVE_MEMORY = "GPU memory in use leaves too little for the share (live)"
PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"


class FilterPlugin:
    """Base class: override ``keep`` (vectorised) and ``reasons`` (per rejected node)."""

    name = "filter"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        """False when the filter cannot reject anything for this pod (skipped, for speed)."""
        return True

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        """Boolean mask over ``idx``: which of these nodes pass."""
        raise NotImplementedError

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        """Why node ``i`` fails this filter (called only for rejected nodes)."""
        return [self.name]

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        """reason -> how many of the ``rejected`` nodes fail for it (override to vectorise)."""
        counts: Counter[str] = Counter()
        for i in rejected.tolist():
            counts.update(self.reasons(pod, cluster, i))
        return counts


UNSCHEDULABLE = "node(s) were unschedulable"


class NodeUnschedulableFilter(FilterPlugin):
    """A cordoned node (``spec.unschedulable``) takes only pods tolerating the taint
    ``node.kubernetes.io/unschedulable:NoSchedule`` (kube-scheduler's NodeUnschedulable)."""

    name = "node unschedulable"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        return bool(cluster.unschedulable.any()) and not tolerates_unschedulable(pod.tolerations)

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        return ~cluster.unschedulable[idx]

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        return [UNSCHEDULABLE]

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        return Counter({UNSCHEDULABLE: len(rejected)})


class NodeSelectorFilter(FilterPlugin):
    """``nodeSelector`` and required node affinity (kube-scheduler's NodeAffinity filter)."""

    name = "node selector"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        return bool(pod.node_selector) or (
            pod.placement is not None and pod.placement.rules.node_affinity.required is not None
        )

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        ok = cluster.label_mask(pod.node_selector)[idx]
        placement = pod.placement
        if placement is not None and placement.rules.node_affinity.required is not None:
            ok &= required_affinity_mask(placement.rules.node_affinity, cluster)[idx]
        return ok

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        return ["node(s) didn't match Pod's node affinity/selector"]

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        return Counter({"node(s) didn't match Pod's node affinity/selector": len(rejected)})


class TaintFilter(FilterPlugin):
    """NoSchedule / NoExecute taints need a matching toleration."""

    name = "taints"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        return bool(cluster.has_taints.any())

    @staticmethod
    def untolerated(pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        node = cluster.nodes[i]
        return [
            str(t) for t in node.schedulable_taints() if not any(tol.tolerates(t) for tol in pod.tolerations)
        ]

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        ok = np.ones(len(idx), dtype=bool)
        for pos in np.flatnonzero(cluster.has_taints[idx]).tolist():
            ok[pos] = not self.untolerated(pod, cluster, int(idx[pos]))
        return ok

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        return [f"node(s) had untolerated taint {self.untolerated(pod, cluster, i)[0]}"]


class NodePortsFilter(FilterPlugin):
    """The pod's host ports are free on the node (kube-scheduler's NodePorts): no pod there binds
    the same protocol and port on the same IP, ``0.0.0.0`` colliding with every IP."""

    name = "ports"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        return bool(pod.host_ports)

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        ok = np.ones(len(idx), dtype=bool)
        for pos in np.flatnonzero(cluster.has_ports[idx]).tolist():
            ok[pos] = not ports_conflict(pod.host_ports, cluster.nodes[int(idx[pos])].ports)
        return ok

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        return [PORTS_TAKEN]

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        return Counter({PORTS_TAKEN: len(rejected)})


class ResourcesFit(FilterPlugin):
    """Every requested resource fits what is free, and the node admits one more pod
    (``status.allocatable.pods``), like kube-scheduler's NodeResourcesFit: CPU, memory (in MiB, or
    in bytes when the pod's ``resources`` name it) and each of the pod's other ``resources``
    (ephemeral storage, hugepages, extended resources; a node without one has 0). A resource is
    checked only when the pod asks for it; every shortage is a reason (``Insufficient <name>``)."""

    name = "resources"

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        # A pod asking no CPU fits a node whose bound pods over-commit it (free below zero).
        ok = cluster.cpu_free[idx] >= pod.cpu_milli if pod.cpu_milli else np.ones(len(idx), dtype=bool)
        if pod.memory_mib and not (pod.resources and pod.exact_memory):
            ok &= cluster.mem_free[idx] >= pod.memory_mib
        for name, amount in pod.resources:
            ok &= cluster.resource_free(name)[idx] >= amount
        if cluster.any_pod_limit:
            ok &= cluster.pods_free[idx] >= 1
        return ok

    def _checks(self, pod: PodRequest, cluster: ClusterState) -> list[tuple[str, np.ndarray, int]]:
        """(reason, free per node, amount asked) for every resource the pod asks for."""
        checks = []
        if pod.cpu_milli:
            checks.append(("Insufficient cpu", cluster.cpu_free, pod.cpu_milli))
        if pod.memory_mib and not (pod.resources and pod.exact_memory):
            checks.append(("Insufficient memory", cluster.mem_free, pod.memory_mib))
        for name, amount in pod.resources:
            checks.append((f"Insufficient {name}", cluster.resource_free(name), amount))
        return checks

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        out = []
        if cluster.pods_free[i] < 1:
            out.append("Too many pods")
        out += [reason for reason, free, amount in self._checks(pod, cluster) if free[i] < amount]
        return out

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        counts: Counter[str] = Counter()
        pods = int(np.count_nonzero(cluster.pods_free[rejected] < 1))
        if pods:
            counts["Too many pods"] = pods
        for reason, free, amount in self._checks(pod, cluster):
            short = int(np.count_nonzero(free[rejected] < amount))
            if short:
                counts[reason] = short
        return counts


class GpuFit(FilterPlugin):
    """GPUs: k fully free GPUs of an allowed model, or one GPU with room for the share.

    A share also needs the memory guard: the GPU's memory in use, as its node last reported it,
    must leave the share's memory whatever the books say (``GpuState.fits_live_memory``); a node
    refused only by the guard is counted under ``LIVE_MEMORY``.

    Whole GPUs must also fit the kubelet's count: the node's ``nvidia.com/gpu`` allocatable less
    what its pods request, whoever scheduled them (pods of other schedulers hold no kubegpu device
    but the kubelet counts them).
    """

    name = "gpu"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        return pod.gpu_count > 0

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        if pod.is_share:
            plain = not (pod.gpu_models or pod.gpu_memory_mib or pod.enforced_share or cluster.any_gpu_memory)
            if plain:
                return cluster.gpu_max_free[idx] >= pod.gpu_milli
            return cluster.share_view(pod).least_left[idx] <= MILLI
        if not pod.gpu_models:
            ok = cluster.gpu_full_free[idx] >= pod.gpu_count
        else:
            whole = (cluster.gpu_free[idx] == MILLI) & cluster.gpu_model_mask(pod.gpu_models)[idx]
            ok = whole.sum(axis=1) >= pod.gpu_count
        if cluster.any_gpu_resource_limit:
            ok &= cluster.gpu_resource_free[idx] >= pod.gpu_count
        return ok

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        if pod.gpu_models and not cluster.model_mask(pod.gpu_models)[i]:
            return [f"no GPU of model {'|'.join(sorted(pod.gpu_models))}"]
        if pod.is_share:
            if pod.enforced_share and not cluster.gpu_enforced[i].any():
                return [NO_ENFORCING_GPU]
            if cluster.any_live_memory and cluster.share_fits_by_books(pod, np.array([i]))[0]:
                return [LIVE_MEMORY]
            return [self._share_reason(pod)]
        return ["Insufficient nvidia.com/gpu"]

    @staticmethod
    def _share_reason(pod: PodRequest) -> str:
        what = f"{pod.gpu_milli} milli" if pod.gpu_milli else f"{pod.gpu_memory_mib} MiB"
        enforcing = " that enforces shares (MPS)" if pod.enforced_share else ""
        return f"no GPU{enforcing} with {what} free"

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        counts: Counter[str] = Counter()
        if pod.gpu_models:
            wrong = ~cluster.model_mask(pod.gpu_models)[rejected]
            n_wrong = int(np.count_nonzero(wrong))
            if n_wrong:
                counts[f"no GPU of model {'|'.join(sorted(pod.gpu_models))}"] = n_wrong
            rejected = rejected[~wrong]
        if pod.is_share and pod.enforced_share:
            unenforced = ~cluster.gpu_enforced[rejected].any(axis=1)
            n_unenforced = int(np.count_nonzero(unenforced))
            if n_unenforced:
                counts[NO_ENFORCING_GPU] = n_unenforced
            rejected = rejected[~unenforced]
        if pod.is_share and cluster.any_live_memory and len(rejected):
            guarded = cluster.share_fits_by_books(pod, rejected)
            n_guarded = int(np.count_nonzero(guarded))
            if n_guarded:
                counts[LIVE_MEMORY] = n_guarded
            rejected = rejected[~guarded]
        if len(rejected):
            counts[self.reasons(pod, cluster, int(rejected[0]))[0]] = len(rejected)
        return counts


class TopologyFit(FilterPlugin):
    """A multi-GPU pod's REQUIRE wishes: some free set of k GPUs must meet them."""

    name = "topology"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        return pod.whole_gpus >= 2 and pod.topology.required()

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        ok = np.zeros(len(idx), dtype=bool)
        for pos, i in enumerate(idx.tolist()):
            node = cluster.nodes[i]
            ok[pos] = (
                best_gpu_set(node.links(), node.free_gpu_indices(pod), pod.whole_gpus, pod.topology)
                is not None
            )
        return ok

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        return Counter({self.reasons(pod, cluster, int(rejected[0]))[0]: len(rejected)})

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        wish, k = pod.topology, pod.whole_gpus
        parts = []
        if wish.nvlink == Wish.REQUIRE:
            parts.append("NVLink-connected")
        if wish.same_pcie_switch == Wish.REQUIRE:
            parts.append("same-PCIe-switch")
        if wish.same_numa == Wish.REQUIRE:
            parts.append("single-NUMA")
        return [f"no {' '.join(parts)} set of {k} GPUs"]


class RdmaFit(FilterPlugin):
    """The pod's RDMA interfaces: enough free VFs, on PFs with bandwidth left for each interface's
    minimum (``NicState.shortage``). Counted as ``NO_FREE_VFS`` or ``NO_BANDWIDTH``."""

    name = "rdma"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        return bool(pod.rdma)

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        ok = cluster.rdma_free_vfs[idx] >= pod.rdma.count
        if pod.rdma.min_mbps:
            for pos in np.flatnonzero(ok).tolist():
                ok[pos] = not cluster.nodes[int(idx[pos])].nics.shortage(pod.rdma)
        return ok

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        return [cluster.nodes[i].nics.shortage(pod.rdma) or NO_FREE_VFS]

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        few = cluster.rdma_free_vfs[rejected] < pod.rdma.count
        counts: Counter[str] = Counter()
        if few.any():
            counts[NO_FREE_VFS] = int(np.count_nonzero(few))
        if not few.all():
            counts[NO_BANDWIDTH] = int(np.count_nonzero(~few))
        return counts


def required_affinity_mask(affinity: NodeAffinity, cluster: ClusterState) -> np.ndarray:
    """Per cluster node: it satisfies the required node affinity (memoised on the placement view,
    or computed for the nodes alone when the cluster keeps none)."""
    if cluster.placement is not None:
        return cluster.placement.node_affinity_mask(affinity)[: len(cluster)]
    return np.fromiter(
        (affinity.matches(node.name, node.labels) for node in cluster.nodes), dtype=bool, count=len(cluster)
    )


class PlacementFilter(FilterPlugin):
    """Topology spread constraints (DoNotSchedule) and inter-pod affinity, including placed pods'
    required anti-affinity against this pod (kube-scheduler's PodTopologySpread and
    InterPodAffinity filters, in that order)."""

    name = "placement"

    def applies(self, pod: PodRequest, cluster: ClusterState) -> bool:
        view = cluster.placement
        if view is None:
            return False
        placement = pod.placement
        if placement is None:  # a pod without rules: only placed pods' anti-affinity can matter
            return bool(view.index.with_required_anti)
        return view.filters_apply(placement, node_affinity=False)

    def codes(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        assert cluster.placement is not None
        return cluster.placement.filter(pod_placement(pod), idx, node_affinity=False)

    def keep(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        return self.codes(pod, cluster, idx) == PLACEMENT_PASS

    def reasons(self, pod: PodRequest, cluster: ClusterState, i: int) -> list[str]:
        code = int(self.codes(pod, cluster, np.array([i]))[0])
        return [PLACEMENT_REASONS[code]] if code else []

    def count_reasons(self, pod: PodRequest, cluster: ClusterState, rejected: np.ndarray) -> Counter[str]:
        codes = self.codes(pod, cluster, rejected)
        return Counter(PLACEMENT_REASONS[int(c)] for c in codes.tolist() if c)


def pod_placement(pod: PodRequest) -> PodPlacement:
    """The pod's placement facts and rules (a pod without any: its uid and namespace, no labels)."""
    if pod.placement is not None:
        return pod.placement
    namespace, slash, _name = pod.name.partition("/")
    return PodPlacement(
        PodFacts(pod.uid, namespace if slash and namespace else "default"), tolerations=pod.tolerations
    )


DEFAULT_FILTERS: tuple[FilterPlugin, ...] = (
    NodeUnschedulableFilter(),
    NodeSelectorFilter(),
    TaintFilter(),
    NodePortsFilter(),
    ResourcesFit(),
    GpuFit(),
    TopologyFit(),
    RdmaFit(),
    PlacementFilter(),
)


def apply_filters(
    pod: PodRequest,
    cluster: ClusterState,
    filters: Sequence[FilterPlugin],
    idx: np.ndarray,
    collect: bool,
) -> tuple[np.ndarray, list[tuple[FilterPlugin, np.ndarray]]]:
    """Run the filters in order over node indices ``idx``: the survivors and, if ``collect``,
    (filter, indices it rejected) for every filter that rejected some (each node once)."""
    rejected: list[tuple[FilterPlugin, np.ndarray]] = []
    for f in filters:
        if not len(idx):
            break
        if not f.applies(pod, cluster):
            continue
        ok = f.keep(pod, cluster, idx)
        if collect and not ok.all():
            rejected.append((f, idx[~ok]))
        idx = idx[ok]
    return idx, rejected


def run_filters(
    pod: PodRequest,
    cluster: ClusterState,
    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS,
    explain: bool = True,
) -> tuple[np.ndarray, Counter[str]]:
    """The indices of the nodes that pass every filter and, if none does and ``explain`` is set,
    reason -> node count (every node counted under the first filter it fails)."""
    idx, rejected = apply_filters(pod, cluster, filters, cluster.all_indices, collect=explain)
    why: Counter[str] = Counter()
    if explain and not len(idx):
        for f, out in rejected:
            why.update(f.count_reasons(pod, cluster, out))
    return idx, why


def failed_nodes(
    pod: PodRequest,
    cluster: ClusterState,
    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS,
    among: np.ndarray | None = None,
) -> dict[str, str]:
    """node name -> why it cannot take ``pod`` (reasons joined by ", "), for the nodes that fail.

    The per-node view a scheduler extender's filter answer needs (``FailedNodes``); ``among``
    restricts the check to some node indices.
    """
    return filter_nodes(pod, cluster, filters, among)[1]


def filter_nodes(
    pod: PodRequest,
    cluster: ClusterState,
    filters: Sequence[FilterPlugin] = DEFAULT_FILTERS,
    among: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[str, str]]:
    """The indices (of ``among``, default every node) that pass, and ``failed_nodes``' reasons for
    the rest, in one pass of the filters."""
    idx = cluster.all_indices if among is None else np.asarray(among, dtype=np.int64)
    kept, rejected = apply_filters(pod, cluster, filters, idx, collect=True)
    return kept, {
        cluster.nodes[i].name: ", ".join(f.reasons(pod, cluster, i))
        for f, out in rejected
        for i in out.tolist()
    }


def unschedulable_message(total: int, reasons: Mapping[str, int]) -> str:
    """``0/12 nodes are available: 8 insufficient nvidia.com/gpu, 4 no NVLink-connected set ...``."""
    parts = [f"{n} {text}" for text, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))]
    return f"0/{total} nodes are available" + (": " + ", ".join(parts) if parts else "") + "."
