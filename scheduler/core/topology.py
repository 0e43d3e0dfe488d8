"""Topology-aware choice of whole GPUs inside one node, looking ahead to the pods that come next.

Link score: a GPU set is scored the way NVIDIA's go-gpuallocator scores it, the sum over its pairs of
100 per NVLink plus the PCIe relation (PIX 50, PXB 40, PHB 30, NODE 20, SYS 10).

``best_gpu_set`` (kubegpu's choice) does not simply take the best-connected set for the pod at hand:
that is myopic (on a DGX-1 with {0, 2, 4, 5} free it would take {0, 4}, two NVLinks across the
sockets, and leave {2, 5}, a pair with no NVLink at all). Among the candidate sets S of the free GPUs
F it maximises, in this order:

1. the PREFER topology wishes S meets (REQUIRE wishes filter the candidates);
2. the *partition score*: the link score of S plus the best score into which the rest F - S can be
   split into sets of the same size (one smaller remainder set allowed, its pairs counting too):
   go-gpuallocator's best-effort criterion, so the choice is as good as NVIDIA's on its own terms.
   Among partitions of equal score, the one with the fewest sets spanning both sockets (a PCIe SYS
   pair) wins: on a DGX-1, {0,4}, {1,5}, {2,3}, {6,7} scores as high as {0,3}, {1,2}, {4,7},
   {5,6}, but puts two pods across the sockets;
3. the link score of S itself (the pod at hand is certain, the future is not), again fewer sockets
   spanned on equal scores;
4. the *look-ahead*: how well the rest can serve future pods of other sizes, the sum over the
   sizes s = 2, 4, 8, ... below the node's GPU count of the best partition score of F - S into
   sets of s (a pod of the whole node's size fits only an idle node, whatever is chosen now). This
   is what go-gpuallocator does not see: for a 1-GPU pod on a 4-GPU machine with NVLink bridges on
   (0, 3) and (1, 2) it takes GPU 0, then GPU 1 and breaks both bridges; this takes 0 then 3;
5. the lowest indices (the lexicographically first set).

Partition scores are computed by dynamic programming over bitmasks of the free GPUs and memoised
on the node's ``LinkMatrix`` (shared by all nodes of identical links), as are the choices, per
(free set, size, wishes, must-include set), so a decision costs a dictionary lookup once a state
has been seen. Nodes of more than ``LOOKAHEAD_GPUS`` GPUs skip steps 2 and 3 (the tables would have
2^n entries) and take the best-connected set, breaking ties by the fewest links cut to the GPUs
that stay free; beyond ``EXHAUSTIVE_LIMIT`` candidate sets the candidates come from a greedy growth
from every free GPU improved by swaps (``_local_search``). ``greedy_gpu_set`` is that myopic rule
for every node (what ``best_gpu_set`` did before the look-ahead; the node-placement benchmark
compares both, and ``besteffort.py`` holds a faithful go-gpuallocator reimplementation).

``must`` lists GPUs the set has to contain (go-gpuallocator's "required" devices): None when they
are not all free or more than ``k``.
"""

from __future__ import annotations

import itertools
import json
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devices.model import Device, DeviceKind, NodeInventory, PCIeRelation, Topology, pair
from scheduler.core.request import TopologyWish, Wish

NVLINK_SCORE = 100
PCIE_SCORE = {
    PCIeRelation.PIX: 50,
    PCIeRelation.PXB: 40,
    PCIeRelation.PHB: 30,
    PCIeRelation.NODE: 20,
    PCIeRelation.SYS: 10,
}
EXHAUSTIVE_LIMIT = 20_000  # candidate sets; beyond this a greedy + swap search is used
LOOKAHEAD_GPUS = 12  # nodes of up to this many GPUs get the partition look-ahead (2^n-entry tables)
SPAN_SCALE = 64  # set value = link score x SPAN_SCALE - (1 if the set spans the sockets); > LOOKAHEAD_GPUS
NO_WISH = TopologyWish()
MAX_SHARED = 1024  # distinct machine link layouts kept
MAX_MEMO = 200_000  # memoised choices per link layout (cleared when full)
MAX_BY_TOPOLOGY = 1 << 14  # (topology object, GPU ids, NUMA) lookups kept (cleared when full)
_SHARED: dict[tuple, LinkMatrix] = {}
# LinkMatrix.shared's answer per live topology object (by identity, through a weak reference whose
# callback drops the entry when the object dies, so the entries are those of the inventories in use),
# its GPU ids and NUMA nodes: nodes rebuilt from the same inventory find their matrix without building
# one to compare (a live cache rebuilds every node after any node change)
_BY_TOPOLOGY: dict[tuple[int, tuple[str, ...], tuple[int, ...]], tuple[weakref.ref, LinkMatrix]] = {}

Choice = tuple[int, ...] | None


def _forget(key: tuple[int, tuple[str, ...], tuple[int, ...]], ref: weakref.ref) -> None:
    """A topology object died: drop its ``_BY_TOPOLOGY`` entry (if still its own)."""
    seen = _BY_TOPOLOGY.get(key)
    if seen is not None and seen[0] is ref:
        del _BY_TOPOLOGY[key]


def pair_score(topology: Topology, a: str, b: str) -> int:
    """go-gpuallocator's link score of one GPU pair."""
    return NVLINK_SCORE * topology.nvlink_count(a, b) + PCIE_SCORE[topology.pcie_relation(a, b)]


class LinkMatrix:
    """Pairwise link facts of one node's GPUs, by GPU index, with memos of scores and chosen sets."""

    def __init__(self, ids: Sequence[str], numa: Sequence[int], topology: Topology) -> None:
        n = len(ids)
        self.n = n
        self.flat = not topology.nvlinks and not topology.pcie
        self.score = [[0] * n for _ in range(n)]
        self.nvlink = [[False] * n for _ in range(n)]
        self.pix = [[False] * n for _ in range(n)]
        self.cross = [[False] * n for _ in range(n)]  # across the sockets (PCIe SYS)
        for i, j in itertools.combinations(range(n), 2):
            s = pair_score(topology, ids[i], ids[j])
            self.score[i][j] = self.score[j][i] = s
            linked = topology.nvlink_count(ids[i], ids[j]) > 0
            self.nvlink[i][j] = self.nvlink[j][i] = linked
            same = topology.pcie.get(pair(ids[i], ids[j])) == PCIeRelation.PIX
            self.pix[i][j] = self.pix[j][i] = same
            far = topology.pcie_relation(ids[i], ids[j]) == PCIeRelation.SYS and not self.flat
            self.cross[i][j] = self.cross[j][i] = far
        self.numa = list(numa)
        self.memo: dict[tuple, Choice] = {}  # (free mask, k, wish, must mask, look-ahead) -> set
        self._values: list[int] | None = None
        self._exact: dict[tuple[int, int], int] = {}
        self._partition: dict[tuple[int, int], int] = {}
        self.future_sizes = tuple(1 << e for e in range(1, max(n, 2).bit_length()) if 1 << e < n)

    def signature(self) -> tuple:
        """Everything the set choice depends on (not the device ids)."""
        return (
            self.flat,
            tuple(map(tuple, self.score)),
            tuple(map(tuple, self.nvlink)),
            tuple(map(tuple, self.pix)),
            tuple(self.numa),
        )

    @classmethod
    def shared(cls, ids: Sequence[str], numa: Sequence[int], topology: Topology) -> LinkMatrix:
        """The matrix of this node, shared with every node of identical links (and so its memo).
        Asked again with the same ``topology`` object, ids and NUMA nodes, the same matrix without
        building one (a ``Topology`` is not changed once built)."""
        by_object = (id(topology), tuple(ids), tuple(numa))
        seen = _BY_TOPOLOGY.get(by_object)
        if seen is not None and seen[0]() is topology:
            return seen[1]
        matrix = cls(ids, numa, topology)
        key = matrix.signature()
        known = _SHARED.get(key)
        if known is None:
            if len(_SHARED) >= MAX_SHARED:
                _SHARED.clear()
                _BY_TOPOLOGY.clear()
            known = _SHARED[key] = matrix
        if len(_BY_TOPOLOGY) >= MAX_BY_TOPOLOGY:
            _BY_TOPOLOGY.clear()
        _BY_TOPOLOGY[by_object] = (weakref.ref(topology, lambda ref: _forget(by_object, ref)), known)
        return known

    def set_score(self, gpus: Iterable[int]) -> int:
        sc = self.score
        return sum(sc[a][b] for a, b in itertools.combinations(list(gpus), 2))

    # -- scores of GPU sets given as bitmasks (nodes of up to LOOKAHEAD_GPUS GPUs) -------------

    def mask_value(self, mask: int) -> int:
        """Value of the set of GPUs whose bits are set in ``mask``: its link score times ``SPAN_SCALE``,
        less 1 if it spans the sockets (so sums compare by link score first, then sockets spanned)."""
        table = self._values
        if table is None:
            n = self.n
            scores = [0] * (1 << n)
            spans = [False] * (1 << n)
            sc, cross = self.score, self.cross
            for m in range(1, 1 << n):
                low = (m & -m).bit_length() - 1
                rest = m & (m - 1)
                others = _bits(rest)
                scores[m] = scores[rest] + sum(sc[low][j] for j in others)
                spans[m] = spans[rest] or any(cross[low][j] for j in others)
            table = [SPAN_SCALE * scores[m] - spans[m] for m in range(1 << n)]
            self._values = table
        return table[mask]

    def exact_partition(self, mask: int, size: int) -> int:
        """Best total value of splitting ``mask`` (a multiple of ``size`` GPUs) into sets of ``size``."""
        if mask == 0:
            return 0
        key = (mask, size)
        known = self._exact.get(key)
        if known is not None:
            return known
        low = mask & -mask
        rest = mask ^ low
        best = -1
        for others in itertools.combinations(_bits(rest), size - 1):
            group = low | _mask(others)
            value = self.mask_value(group) + self.exact_partition(mask ^ group, size)
            if value > best:
                best = value
        self._exact[key] = best
        return best

    def partition_score(self, mask: int, size: int) -> int:
        """go-gpuallocator's partition score (as values, see ``mask_value``): the best split of ``mask``
        into sets of ``size`` and one remainder set of ``popcount(mask) % size`` GPUs."""
        if size <= 1 or mask == 0:
            return 0
        key = (mask, size)
        known = self._partition.get(key)
        if known is not None:
            return known
        count = mask.bit_count()
        left = count % size
        if count <= size:
            best = self.mask_value(mask)
        elif left == 0:
            best = self.exact_partition(mask, size)
        else:
            best = max(
                self.mask_value(_mask(rem)) + self.exact_partition(mask ^ _mask(rem), size)
                for rem in itertools.combinations(_bits(mask), left)
            )
        self._partition[key] = best
        return best

    def lookahead(self, rest: int) -> int:
        """How well the GPUs ``rest`` can serve future pods: partition scores summed over the sizes
        2, 4, ... below the node's GPU count."""
        return sum(self.partition_score(rest, s) for s in self.future_sizes)

    # -- topology wishes ---------------------------------------------------------------------

    def satisfies(self, gpus: Sequence[int], wish: TopologyWish, level: Wish) -> int:
        """How many of the wishes at ``level`` the set meets (all of them, for REQUIRE checks)."""
        met = 0
        if wish.nvlink == level and all(self.nvlink[a][b] for a, b in itertools.combinations(gpus, 2)):
            met += 1
        if wish.same_pcie_switch == level and all(self.pix[a][b] for a, b in itertools.combinations(gpus, 2)):
            met += 1
        if wish.same_numa == level and len({self.numa[g] for g in gpus}) <= 1:
            met += 1
        return met

    def prefer_count(self, wish: TopologyWish) -> int:
        return sum(1 for w in (wish.nvlink, wish.same_pcie_switch, wish.same_numa) if w == Wish.PREFER)

    def required_count(self, wish: TopologyWish) -> int:
        return sum(1 for w in (wish.nvlink, wish.same_pcie_switch, wish.same_numa) if w == Wish.REQUIRE)


def _mask(indices: Iterable[int]) -> int:
    m = 0
    for i in indices:
        m |= 1 << i
    return m


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def best_gpu_set(
    links: LinkMatrix,
    free: Iterable[int],
    k: int,
    wish: TopologyWish = NO_WISH,
    must: Iterable[int] = (),
) -> Choice:
    """kubegpu's choice of ``k`` GPUs among ``free`` (indices), containing ``must``, looking ahead.

    None if no set meets the REQUIRE wishes, fewer than ``k`` GPUs are free (or ``k`` is negative),
    or ``must`` is not free (an unhealthy or absent GPU is never free) or larger than ``k``. A free
    index that is not a GPU of the machine is a caller's error (``ValueError``).
    """
    return _choose(links, free, k, wish, must, lookahead=True)


def greedy_gpu_set(
    links: LinkMatrix,
    free: Iterable[int],
    k: int,
    wish: TopologyWish = NO_WISH,
    must: Iterable[int] = (),
) -> Choice:
    """The myopic choice: the best-connected set, ties to the fewest links cut, then lowest indices."""
    return _choose(links, free, k, wish, must, lookahead=False)


def checked_free(links: LinkMatrix, free: Iterable[int]) -> list[int]:
    """The free GPU indices, sorted and unique; ``ValueError`` naming any that is not 0..n-1."""
    out = sorted(set(free))
    stray = [g for g in out if not 0 <= g < links.n]
    if stray:
        raise ValueError(f"GPU indices {stray} are not GPUs of this machine (0..{links.n - 1})")
    return out


def _choose(
    links: LinkMatrix, free: Iterable[int], k: int, wish: TopologyWish, must: Iterable[int], lookahead: bool
) -> Choice:
    free = checked_free(links, free)
    required = sorted(set(must))
    if k < 0:
        return None
    if k == 0:
        return () if not required else None
    if len(free) < k or len(required) > k or not set(required) <= set(free):
        return None
    if k == 1 or not wish.any():
        wish = NO_WISH
    if links.flat and not wish.any():
        rest = [g for g in free if g not in required]
        return tuple(sorted(required + rest[: k - len(required)]))
    key = (_mask(free), k, wish, _mask(required), lookahead and links.n <= LOOKAHEAD_GPUS)
    memo = links.memo
    if key in memo:
        return memo[key]
    result = _search(links, free, k, wish, required, key[4])
    if len(memo) >= MAX_MEMO:
        memo.clear()
    memo[key] = result
    return result


def _candidates(links: LinkMatrix, free: list[int], k: int, required: list[int]) -> Iterable[tuple[int, ...]]:
    """Every k-set of ``free`` containing ``required`` (lexicographic), or local-search ones if too many."""
    others = [g for g in free if g not in required]
    want = k - len(required)
    total = 1
    for i in range(want):
        total = total * (len(others) - i) // (i + 1)
    if total > EXHAUSTIVE_LIMIT:
        return _local_search(links, free, k, required)
    if not required:
        return itertools.combinations(free, k)
    return (tuple(sorted((*required, *extra))) for extra in itertools.combinations(others, want))


def _search(
    links: LinkMatrix, free: list[int], k: int, wish: TopologyWish, required: list[int], lookahead: bool
) -> Choice:
    need = links.required_count(wish)
    prefer = links.prefer_count(wish)
    sc = links.score
    free_mask = _mask(free)
    best: Choice = None
    best_rank: tuple[int, ...] | None = None
    for cand in sorted(_candidates(links, free, k, required)):
        if need and links.satisfies(cand, wish, Wish.REQUIRE) < need:
            continue
        met = links.satisfies(cand, wish, Wish.PREFER) if prefer else 0
        if lookahead:
            chosen = _mask(cand)
            rest = free_mask ^ chosen
            own = links.mask_value(chosen)
            rank: tuple[int, ...] = (
                met,
                own + links.partition_score(rest, k),
                own,
                links.lookahead(rest),
            )
        else:
            rest_list = [g for g in free if g not in cand]
            cut = sum(sc[a][b] for a in cand for b in rest_list)
            rank = (met, links.set_score(cand), -cut)
        if best_rank is None or rank > best_rank:  # candidates in lexicographic order: ties keep the lowest
            best, best_rank = tuple(cand), rank
    return best


def _local_search(
    links: LinkMatrix, free: list[int], k: int, required: Sequence[int] = ()
) -> list[tuple[int, ...]]:
    """Candidate sets for large nodes: greedy growth from every free GPU (after the required ones),
    improved by swaps of one non-required GPU while the set's link score rises."""
    sc = links.score
    fixed = set(required)
    out: list[tuple[int, ...]] = []
    seeds = [g for g in free if g not in fixed] if len(fixed) < k else [None]
    for seed in seeds:
        chosen = list(required) + ([seed] if seed is not None else [])
        while len(chosen) < k:
            nxt = max((g for g in free if g not in chosen), key=lambda g: (sum(sc[g][c] for c in chosen), -g))
            chosen.append(nxt)
        improved = True
        while improved:
            improved = False
            base = links.set_score(chosen)
            for i in range(len(chosen)):
                if chosen[i] in fixed:
                    continue
                for h in free:
                    if h in chosen:
                        continue
                    trial = chosen[:i] + [h] + chosen[i + 1 :]
                    if links.set_score(trial) > base:
                        chosen, improved = trial, True
                        break
                if improved:
                    break
        out.append(tuple(sorted(chosen)))
    return sorted(set(out))


# -- machine descriptions -----------------------------------------------------------------------


def load_machine(source: str | Path | Mapping[str, Any], prefix: str = "GPU-") -> NodeInventory:
    """A node inventory from a machine JSON (``gpus``, ``nvlink`` and ``pcie`` matrices by index).

    Device ids are ``<prefix><index>``; the format is the one of ``devices/topologies/*.json``.
    """
    doc: Mapping[str, Any]
    doc = json.loads(Path(source).read_text()) if isinstance(source, str | Path) else source
    gpus = sorted(doc["gpus"], key=lambda g: int(g["index"]))
    ids = [f"{prefix}{int(g['index'])}" for g in gpus]
    devices = tuple(
        Device(
            id=ids[i],
            kind=DeviceKind.GPU,
            index=int(g["index"]),
            model=str(g.get("model", "")),
            memory_mib=int(g.get("memoryMiB", 0)),
            numa_node=int(g.get("numa", -1)),
        )
        for i, g in enumerate(gpus)
    )
    nvlinks: dict[tuple[str, str], int] = {}
    pcie: dict[tuple[str, str], PCIeRelation] = {}
    for i, j in itertools.combinations(range(len(ids)), 2):
        count = int(doc.get("nvlink", [[0] * len(ids)] * len(ids))[i][j])
        if count:
            nvlinks[pair(ids[i], ids[j])] = count
        if "pcie" in doc:
            pcie[pair(ids[i], ids[j])] = PCIeRelation.parse(str(doc["pcie"][i][j]))
    return NodeInventory(devices, Topology(nvlinks, pcie))
