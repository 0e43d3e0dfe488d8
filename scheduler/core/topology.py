"""Topology-aware choice of whole GPUs inside one node.

A GPU set is scored the way NVIDIA's go-gpuallocator best-effort policy scores it: the sum over
its pairs of a link score, 100 per NVLink between the pair plus the PCIe relation (PIX 50, PXB 40,
PHB 30, NODE 20, SYS 10). More NVLinks beat one switch, a switch beats several, and so on down to
crossing the sockets. ``best_gpu_set`` returns a set of the highest score among the free GPUs
(exhaustively for up to ``EXHAUSTIVE_LIMIT`` candidate sets, which covers every 8-GPU machine), and
among sets of equal score the one that leaves the best-connected GPUs free (fewest links cut to the
GPUs that stay free), then the lowest indices. Topology wishes restrict (REQUIRE) or rank first
(PREFER) the candidate sets. Results are memoised per (free set, size, wishes) on the node's
``LinkMatrix``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
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
NO_WISH = TopologyWish()
MAX_SHARED = 1024  # distinct machine link layouts kept
_SHARED: dict[tuple, LinkMatrix] = {}


def pair_score(topology: Topology, a: str, b: str) -> int:
    """go-gpuallocator's link score of one GPU pair."""
    return NVLINK_SCORE * topology.nvlink_count(a, b) + PCIE_SCORE[topology.pcie_relation(a, b)]


class LinkMatrix:
    """Pairwise link facts of one node's GPUs, by GPU index, with a memo of chosen sets."""

    def __init__(self, ids: Sequence[str], numa: Sequence[int], topology: Topology) -> None:
        n = len(ids)
        self.n = n
        self.flat = not topology.nvlinks and not topology.pcie
        self.score = [[0] * n for _ in range(n)]
        self.nvlink = [[False] * n for _ in range(n)]
        self.pix = [[False] * n for _ in range(n)]
        for i, j in itertools.combinations(range(n), 2):
            s = pair_score(topology, ids[i], ids[j])
            self.score[i][j] = self.score[j][i] = s
            linked = topology.nvlink_count(ids[i], ids[j]) > 0
            self.nvlink[i][j] = self.nvlink[j][i] = linked
            same = topology.pcie.get(pair(ids[i], ids[j])) == PCIeRelation.PIX
            self.pix[i][j] = self.pix[j][i] = same
        self.numa = list(numa)
        self.memo: dict[tuple[int, int, TopologyWish], tuple[int, ...] | None] = {}

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
        """The matrix of this node, shared with every node of identical links (and so its memo)."""
        matrix = cls(ids, numa, topology)
        key = matrix.signature()
        known = _SHARED.get(key)
        if known is None:
            if len(_SHARED) >= MAX_SHARED:
                _SHARED.clear()
            known = _SHARED[key] = matrix
        return known

    def set_score(self, gpus: Sequence[int]) -> int:
        sc = self.score
        return sum(sc[a][b] for a, b in itertools.combinations(gpus, 2))

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


def _mask(indices: Sequence[int]) -> int:
    m = 0
    for i in indices:
        m |= 1 << i
    return m


def best_gpu_set(
    links: LinkMatrix, free: Sequence[int], k: int, wish: TopologyWish = NO_WISH
) -> tuple[int, ...] | None:
    """The best ``k`` GPUs among ``free`` (indices), or None if no set meets the REQUIRE wishes."""
    free = sorted(free)
    if k <= 0:
        return ()
    if len(free) < k:
        return None
    if links.flat and not wish.any():
        return tuple(free[:k])
    key = (_mask(free), k, wish if k > 1 else NO_WISH)
    if key in links.memo:
        return links.memo[key]
    result = _search(links, free, k, wish)
    links.memo[key] = result
    return result


def _search(links: LinkMatrix, free: list[int], k: int, wish: TopologyWish) -> tuple[int, ...] | None:
    need = links.required_count(wish)
    total = 1
    for i in range(k):
        total = total * (len(free) - i) // (i + 1)
    candidates = (
        itertools.combinations(free, k) if total <= EXHAUSTIVE_LIMIT else _local_search(links, free, k)
    )
    sc = links.score
    best: tuple[int, ...] | None = None
    best_key: tuple[int, int, int] | None = None
    for cand in candidates:
        if need and links.satisfies(cand, wish, Wish.REQUIRE) < need:
            continue
        rest = [g for g in free if g not in cand]
        cut = sum(sc[a][b] for a in cand for b in rest)
        rank = (links.satisfies(cand, wish, Wish.PREFER), links.set_score(cand), -cut)
        if best_key is None or rank > best_key:  # combinations come in lexicographic order
            best, best_key = tuple(cand), rank
    return best


def _local_search(links: LinkMatrix, free: list[int], k: int) -> list[tuple[int, ...]]:
    """Candidate sets for large nodes: greedy growth from every seed GPU, improved by 1-swaps."""
    sc = links.score
    out: list[tuple[int, ...]] = []
    for seed in free:
        chosen = [seed]
        while len(chosen) < k:
            nxt = max((g for g in free if g not in chosen), key=lambda g: (sum(sc[g][c] for c in chosen), -g))
            chosen.append(nxt)
        improved = True
        while improved:
            improved = False
            base = links.set_score(chosen)
            for i in range(len(chosen)):
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
