"""Preemption: which lower-priority pods to evict so that a pod that fits nowhere fits somewhere.

As kube-scheduler's DefaultPreemption, but the devices freed must make a valid set for the pod:

- **Who may preempt.** Not a pod with ``preemptionPolicy: Never``, nor one whose nominated node
  still has lower-priority pods terminating (it waits for them; ``eligible``).
- **Who may be evicted.** Only pods of strictly lower priority (``potential victims``). With
  ``pdb_hard`` (the default: evictions go through the Eviction API, which refuses them) a victim
  whose eviction would exceed a PodDisruptionBudget's ``disruptionsAllowed`` is never chosen;
  without it, violations are only avoided as far as possible, as kube-scheduler does.
- **Victims on one node** (``select_victims``). The pod must fit once every potential victim is
  gone; then the cheapest set is chosen by, in order: fewest PDB violations, lowest highest victim
  priority, lowest sum of priorities (each offset by 2^31, so in practice fewest victims first),
  fewest victims, newest victims. For whole GPUs every set of ``k`` GPUs that meets the pod's
  required topology and model is tried, its victims being the pods holding those GPUs; a share
  tries every GPU with the cheapest sets of shares on it to evict. If CPU, memory, the pod count,
  the GPU count or the pod's RDMA interfaces still do not fit, the cheapest other victims are added
  (every subset of up to ``EXACT_EXTRAS`` candidates, else least important first, then the most
  important given back).
  The result is checked once more with the core's own set choice and ``fits_other``. Nodes with
  more candidate sets than ``topology.EXHAUSTIVE_LIMIT``, or whose cheapest sets ``fits_other``
  refuses, fall back to kube-scheduler's reprieve: evict all potential victims, then give back
  the most important ones (PDB-protected first) while the pod still fits.
- **Which node** (``pick_candidate``). kube-scheduler's order: fewest PDB violations, lowest
  highest victim priority, lowest offset sum of priorities, fewest victims, latest start among
  the highest-priority victims, then the order given.

Whether the pod fits is decided by the core's own rules: CPU, memory, the other resources the pod
asks for (``PodRequest.resources``: ephemeral storage, hugepages, extended resources), its host
ports (evicting the pods that bind them frees them), the node's pod count, its RDMA interfaces
(free VFs on PFs with the bandwidth left for each interface's minimum, ``NicState.shortage_without``:
evicting the pods that hold VFs or reserve bandwidth there frees them), GPUs
by id (healthy, of an allowed model, enforcing shares for an enforced share, whole or with room
for the share), required topology via
``LinkMatrix`` / ``best_gpu_set``, the kubelet's count of the node's GPU resource (pods of other
schedulers hold GPUs the scheduler cannot name: ``charged_gpus``), and an optional
``fits_other(victim uids)`` for the rules this module does not know (pod affinity, spread).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.core.rdma import NicState, VfGrant
from scheduler.core.request import MILLI, HostPort, PodRequest, Wish, ports_conflict
from scheduler.core.selectors import LabelSelector
from scheduler.core.topology import EXHAUSTIVE_LIMIT, LinkMatrix, best_gpu_set

PREEMPT_NEVER = "Never"
PREEMPT_LOWER = "PreemptLowerPriority"
PRIORITY_OFFSET = 1 << 31  # kube-scheduler adds MaxInt32 + 1 to every priority it sums
EXACT_SHARE_HOLDERS = 10  # shares on one GPU up to which every subset of them is tried
SHARE_OPTIONS = 4  # cheapest share evictions per GPU carried on to the CPU/memory completion
EXACT_EXTRAS = 8  # other victims (for CPU, memory, pod count) up to which every subset is tried


@dataclass(frozen=True)
class GpuSlot:
    """One GPU of the node, in index order."""

    id: str
    model: str = ""
    memory_mib: int = 0
    healthy: bool = True
    share_enforced: bool = False  # the node enforces shares of this GPU (MPS)


@dataclass(frozen=True)
class RunningPod:
    """A pod placed on the node: what it holds and how important it is."""

    uid: str
    name: str = ""  # namespace/name, for messages and PDBs' disruptedPods
    namespace: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    priority: int = 0
    start_time: float = math.inf  # seconds; unknown counts as now (the newest)
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: Mapping[str, tuple[int, int]] = field(default_factory=dict, hash=False, compare=False)
    # what it counts against the node's GPU resource allocatable (``nvidia.com/gpu``); None: one
    # per whole GPU it holds (shares count none). Pods of other schedulers: their request.
    charged_gpus: int | None = None
    # the other resources it holds (name -> amount, as PodRequest.resources) and its host ports
    resources: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)
    host_ports: tuple[HostPort, ...] = ()
    rdma: tuple[VfGrant, ...] = ()  # the RDMA VFs it holds, with the bandwidth each reserves

    @property
    def charge(self) -> int:
        if self.charged_gpus is not None:
            return self.charged_gpus
        return sum(1 for milli, _memory in self.gpus.values() if milli >= MILLI)

    terminating: bool = False

    @property
    def short_name(self) -> str:
        return self.name.rpartition("/")[2] or self.uid


@dataclass(frozen=True)
class NodeOffer:
    """A node as preemption sees it: capacity, GPUs, links, and every pod placed on it (pods
    nominated to it with a priority at least the preemptor's belong here too, as if placed: their
    room is promised to them)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSlot, ...] = ()
    pods: tuple[RunningPod, ...] = ()
    links: LinkMatrix | None = None  # None: no topology facts (any set of GPUs will do)
    max_pods: int | None = None  # status.allocatable.pods; None: no limit (0: no pod fits)
    gpu_resource: int | None = None  # status.allocatable of the GPU resource; None: not checked
    # the other resources' allocatable (NodeState.allocatable; a name not here is 0)
    allocatable: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)
    # its RDMA PFs and VFs with what every pod of ``pods`` holds booked (``NodeState.nics``; read only)
    nics: NicState = field(default_factory=NicState, hash=False, compare=False)


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget: its namespace, selector, ``status.disruptionsAllowed`` and
    ``status.disruptedPods`` (names of pods whose eviction it has already counted)."""

    namespace: str
    selector: LabelSelector
    disruptions_allowed: int
    disrupted_pods: frozenset[str] = frozenset()
    name: str = ""

    def covers(self, pod: RunningPod) -> bool:
        return pod.namespace == self.namespace and self.selector.matches(pod.labels)


@dataclass(frozen=True)
class Victims:
    """The pods to evict from ``node`` (most important first) and how many PDBs that breaks."""

    node: str
    pods: tuple[RunningPod, ...]
    pdb_violations: int = 0

    def cost(self) -> tuple[int, int, int, int, float]:
        """The ranking key, lower is better (see the module docstring)."""
        return cost_key(self.pods, self.pdb_violations)


def importance(pod: RunningPod) -> tuple[int, float]:
    """Sort key, higher is more important: priority, then earlier start (kube's MoreImportantPod)."""
    return (pod.priority, -pod.start_time)


def cost_key(pods: Sequence[RunningPod], violations: int) -> tuple[int, int, int, int, float]:
    if not pods:
        return (violations, -(1 << 62), 0, 0, -math.inf)
    top = max(p.priority for p in pods)
    earliest = min(p.start_time for p in pods if p.priority == top)
    return (violations, top, sum(p.priority + PRIORITY_OFFSET for p in pods), len(pods), -earliest)


def eligible(
    policy: str, nominated_node_pods: Sequence[RunningPod] = (), priority: int = 0
) -> tuple[bool, str]:
    """Whether a pod may preempt at all, and if not why (kube's PodEligibleToPreemptOthers).

    ``nominated_node_pods``: the pods on the node the pod is already nominated to, if any.
    """
    if policy == PREEMPT_NEVER:
        return False, "not eligible due to preemptionPolicy=Never."
    if any(p.terminating and p.priority < priority for p in nominated_node_pods):
        return False, "not eligible due to a terminating pod on the nominated node."
    return True, ""


def pdb_violations(victims: Sequence[RunningPod], budgets: Sequence[Budget]) -> tuple[int, set[str]]:
    """How many of ``victims`` (taken most important first) exceed a covering budget's allowance,
    and their uids (kube's filterPodsWithPDBViolation over the victims)."""
    allowed = [b.disruptions_allowed for b in budgets]
    violating: set[str] = set()
    for pod in sorted(victims, key=importance, reverse=True):
        for i, budget in enumerate(budgets):
            if not budget.covers(pod) or pod.short_name in budget.disrupted_pods:
                continue
            allowed[i] -= 1
            if allowed[i] < 0:
                violating.add(pod.uid)
    return len(violating), violating


def share_need(pod: PodRequest, gpu: GpuSlot) -> tuple[int, int]:
    """(milli, memory MiB) a sharing pod takes of ``gpu`` (the rule of ``GpuState.share_for``)."""
    milli, memory = pod.gpu_milli, pod.gpu_memory_mib
    if not milli:
        milli = -(-memory * MILLI // gpu.memory_mib) if gpu.memory_mib else MILLI
    if not memory and gpu.memory_mib:
        memory = gpu.memory_mib * milli // MILLI
    return min(milli, MILLI), memory


class _Node:
    """Usage of one node with some pods removed, and the fit test of the preemptor."""

    def __init__(
        self,
        pod: PodRequest,
        offer: NodeOffer,
        fits_other: Callable[[frozenset[str]], bool] | None,
        budgets: Sequence[Budget],
    ) -> None:
        self.pod = pod
        self.offer = offer
        self.fits_other = fits_other
        self.budgets = budgets
        self.by_uid = {p.uid: p for p in offer.pods}
        index = {g.id: i for i, g in enumerate(offer.gpus)}
        self.usable = [
            i
            for i, g in enumerate(offer.gpus)
            if g.healthy and pod.allows_model(g.model) and (g.share_enforced or not pod.enforced_share)
        ]  # the GPUs the pod may get
        self.holders: list[list[RunningPod]] = [[] for _ in offer.gpus]
        for p in offer.pods:
            for gpu_id in p.gpus:
                i = index.get(gpu_id)
                if i is not None:
                    self.holders[i].append(p)
        self.cpu_used = sum(p.cpu_milli for p in offer.pods)
        self.memory_used = sum(p.memory_mib for p in offer.pods)
        self.charged = sum(p.charge for p in offer.pods)
        self.resources_used = {
            name: sum(p.resources.get(name, 0) for p in offer.pods) for name, _ in pod.resources
        }
        # the pods binding a host port that collides with one of the pod's
        self.port_holders = frozenset(
            p.uid for p in offer.pods if pod.host_ports and ports_conflict(pod.host_ports, p.host_ports)
        )

    def gpu_use(self, i: int, removed: Collection[str]) -> tuple[int, int]:
        milli = memory = 0
        gpu_id = self.offer.gpus[i].id
        for p in self.holders[i]:
            if p.uid not in removed:
                m, mem = p.gpus[gpu_id]
                milli += m
                memory += mem
        return milli, memory

    def fully_free(self, removed: Collection[str]) -> list[int]:
        """Healthy GPUs nobody holds (any model)."""
        return [
            i
            for i, g in enumerate(self.offer.gpus)
            if g.healthy and all(p.uid in removed for p in self.holders[i])
        ]

    def resources_fit(self, removed: Collection[str]) -> bool:
        """CPU, memory, the other resources, the host ports, the pod count, the RDMA interfaces and
        the GPU count fit once ``removed`` are gone."""
        offer, pod = self.offer, self.pod
        gone = [self.by_uid[u] for u in removed]
        # as in NodeState.check: a resource is checked only when the pod asks for it
        if pod.cpu_milli and self.cpu_used - sum(p.cpu_milli for p in gone) + pod.cpu_milli > offer.cpu_milli:
            return False
        memory_left = offer.memory_mib - (self.memory_used - sum(p.memory_mib for p in gone))
        if pod.memory_mib and not pod.exact_memory and pod.memory_mib > memory_left:
            return False
        for name, amount in pod.resources:
            used = self.resources_used[name] - sum(p.resources.get(name, 0) for p in gone)
            if amount > offer.allocatable.get(name, 0) - used:
                return False
        if not self.port_holders <= set(removed):
            return False
        if offer.max_pods is not None and len(offer.pods) - len(gone) + 1 > offer.max_pods:
            return False
        if pod.rdma and offer.nics.shortage_without(pod.rdma, (g for p in gone for g in p.rdma)):
            return False
        if offer.gpu_resource is None:
            return True
        return self.charged - sum(p.charge for p in gone) + pod.whole_gpus <= offer.gpu_resource

    def share_fits_on(self, i: int, removed: Collection[str]) -> bool:
        gpu = self.offer.gpus[i]
        milli, memory = share_need(self.pod, gpu)
        used_milli, used_memory = self.gpu_use(i, removed)
        return milli <= MILLI - used_milli and (not gpu.memory_mib or memory <= gpu.memory_mib - used_memory)

    def fits(self, removed: Collection[str]) -> bool:
        """The whole test: the core's set choice for whole GPUs, resources, the other rules."""
        pod = self.pod
        if pod.is_share:
            if not any(self.share_fits_on(i, removed) for i in self.usable):
                return False
            if not self.resources_fit(removed):
                return False
        else:
            k = pod.whole_gpus
            if k:
                free = set(self.fully_free(removed))
                candidates = [i for i in self.usable if i in free]
                links = self.offer.links
                if links is None:
                    if len(candidates) < k:
                        return False
                elif best_gpu_set(links, candidates, k, pod.topology) is None:
                    return False
            if not self.resources_fit(removed):
                return False
        return self.fits_other is None or self.fits_other(frozenset(removed))

    def cost(self, removed: Collection[str]) -> tuple[int, int, int, int, float]:
        pods = [self.by_uid[u] for u in removed]
        return cost_key(pods, pdb_violations(pods, self.budgets)[0] if self.budgets else 0)


def _complete(node: _Node, chosen: frozenset[str], pool: Sequence[RunningPod]) -> frozenset[str] | None:
    """The cheapest ``chosen`` plus pods of ``pool`` with which CPU, memory, the pod count, the RDMA
    interfaces and the GPU count fit: every subset of the pods that free any of these when there are at most
    ``EXACT_EXTRAS`` of them, else the least important first and then the most important given back."""
    if node.resources_fit(chosen):
        return chosen
    asked = {name for name, _ in node.pod.resources}
    useful = [
        p
        for p in pool
        if p.cpu_milli
        or p.memory_mib
        or p.charge
        or node.offer.max_pods is not None
        or p.uid in node.port_holders
        or (node.pod.rdma and p.rdma)
        or any(p.resources.get(name) for name in asked)
    ]
    if len(useful) <= EXACT_EXTRAS:
        best: tuple | None = None
        found: frozenset[str] | None = None
        for r in range(1, len(useful) + 1):
            for combo in itertools.combinations(useful, r):
                removed = chosen | {p.uid for p in combo}
                if node.resources_fit(removed):
                    key = node.cost(removed)
                    if best is None or key < best:
                        best, found = key, removed
        return found
    alone = {p.uid for p in useful if pdb_violations([p], node.budgets)[0]}
    removed = set(chosen)
    added: list[RunningPod] = []
    for p in sorted(useful, key=lambda p: (p.uid in alone, importance(p))):  # cheapest first
        removed.add(p.uid)
        added.append(p)
        if node.resources_fit(removed):
            break
    else:
        return None
    for p in sorted(added, key=lambda p: (p.uid not in alone, importance(p)), reverse=True):
        removed.discard(p.uid)  # give back the most important first
        if not node.resources_fit(removed):
            removed.add(p.uid)
    return frozenset(removed)


def _share_options(node: _Node, i: int, potential: frozenset[str]) -> list[frozenset[str]]:
    """Sets of shares on GPU ``i`` whose eviction makes room for the pod's share there, cheapest
    first (every subset for up to ``EXACT_SHARE_HOLDERS`` movable holders, else the greedy one)."""
    movable = [p for p in node.holders[i] if p.uid in potential]
    if not node.share_fits_on(i, frozenset(p.uid for p in movable)):
        return []  # even with every movable share gone there is no room here
    if len(movable) <= EXACT_SHARE_HOLDERS:
        found = []
        for r in range(len(movable) + 1):
            for combo in itertools.combinations(movable, r):
                uids = frozenset(p.uid for p in combo)
                if node.share_fits_on(i, uids):
                    found.append((node.cost(uids), uids))
        found.sort(key=lambda cu: cu[0])
        return [uids for _, uids in found[:SHARE_OPTIONS]]
    removed: set[str] = set()
    for p in sorted(movable, key=importance):
        if node.share_fits_on(i, removed):
            break
        removed.add(p.uid)
    for p in sorted(movable, key=importance, reverse=True):
        if p.uid in removed:
            removed.discard(p.uid)
            if not node.share_fits_on(i, removed):
                removed.add(p.uid)
    return [frozenset(removed)] if node.share_fits_on(i, removed) else []


def _reprieve(node: _Node, potential: Sequence[RunningPod]) -> frozenset[str]:
    """kube-scheduler's reprieve: all potential victims out, then back most important first
    (PDB-violating ones before the others) while the pod still fits."""
    ordered = sorted(potential, key=importance, reverse=True)
    _, violating = pdb_violations(ordered, node.budgets)
    removed = {p.uid for p in ordered}
    for p in [q for q in ordered if q.uid in violating] + [q for q in ordered if q.uid not in violating]:
        removed.discard(p.uid)
        if not node.fits(removed):
            removed.add(p.uid)
    return frozenset(removed)


def _gpu_options(node: _Node, potential: frozenset[str]) -> list[frozenset[str]] | None:
    """The victims that free each distinct valid GPU choice; None when there are too many choices
    to try them all."""
    pod, links = node.pod, node.offer.links
    if pod.is_share:
        return [uids for i in node.usable for uids in _share_options(node, i, potential)]
    k = pod.whole_gpus
    if not k:
        return [frozenset()]
    obtainable = [i for i in node.usable if all(p.uid in potential for p in node.holders[i])]
    if math.comb(len(obtainable), k) > EXHAUSTIVE_LIMIT:
        return None
    need = links.required_count(pod.topology) if links is not None and k > 1 else 0
    seen: dict[frozenset[str], None] = {}
    for combo in itertools.combinations(obtainable, k):
        if need and links is not None and links.satisfies(combo, pod.topology, Wish.REQUIRE) < need:
            continue
        seen.setdefault(frozenset(p.uid for i in combo for p in node.holders[i]))
    return list(seen)


def select_victims(
    pod: PodRequest,
    priority: int,
    offer: NodeOffer,
    budgets: Sequence[Budget] = (),
    *,
    pdb_hard: bool = True,
    fits_other: Callable[[frozenset[str]], bool] | None = None,
) -> Victims | None:
    """The cheapest victims on ``offer`` that let ``pod`` (of ``priority``) fit, or None if no
    eviction of lower-priority pods makes it fit. An empty ``Victims`` means it fits already."""
    node = _Node(pod, offer, fits_other, budgets)
    potential_pods = [p for p in offer.pods if p.priority < priority]
    if pdb_hard:
        potential_pods = [p for p in potential_pods if not pdb_violations([p], budgets)[0]]
    potential = frozenset(p.uid for p in potential_pods)
    if not node.fits(potential):
        return None
    if node.fits(frozenset()):
        return Victims(offer.name, ())
    choices = _gpu_options(node, potential)
    ranked: dict[frozenset[str], tuple] = {}
    for uids in choices or ():
        pool = [p for p in potential_pods if p.uid not in uids]
        done = _complete(node, uids, pool)
        if done is not None and done not in ranked:
            ranked[done] = node.cost(done)
    for uids in sorted(ranked, key=lambda u: ranked[u]):
        if ranked[uids][0] and pdb_hard:
            continue
        if node.fits(uids):  # the core's allocator agrees and the other rules hold
            return _victims(node, uids)
    uids = _reprieve(node, potential_pods)  # too many choices, or the other rules refused them
    result = _victims(node, uids)
    return None if pdb_hard and result.pdb_violations else result


def _victims(node: _Node, uids: Collection[str]) -> Victims:
    chosen = sorted((node.by_uid[u] for u in uids), key=importance, reverse=True)
    return Victims(node.offer.name, tuple(chosen), pdb_violations(chosen, node.budgets)[0])


def pick_candidate(candidates: Sequence[Victims]) -> Victims | None:
    """The node to preempt on, by kube-scheduler's order (ties: the first given)."""
    best: Victims | None = None
    for cand in candidates:
        if best is None or cand.cost() < best.cost():
            best = cand
    return best


def choose(
    pod: PodRequest,
    priority: int,
    offers: Iterable[NodeOffer],
    budgets: Sequence[Budget] = (),
    *,
    pdb_hard: bool = True,
    fits_other: Callable[[str], Callable[[frozenset[str]], bool] | None] | None = None,
) -> Victims | None:
    """The node and victims to preempt for ``pod`` among ``offers`` (the nodes where evicting pods
    might help), or None. ``fits_other(node)`` gives that node's test of the other rules."""
    candidates = []
    for offer in offers:
        victims = select_victims(
            pod,
            priority,
            offer,
            budgets,
            pdb_hard=pdb_hard,
            fits_other=fits_other(offer.name) if fits_other is not None else None,
        )
        if victims is not None and victims.pods:
            candidates.append(victims)
    return pick_candidate(candidates)
