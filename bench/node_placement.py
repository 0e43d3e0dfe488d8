"""Benchmark: which GPUs a node gives to a stream of 1/2/4/8-GPU pods, per choice policy, per machine shape.

    .venv/bin/python bench/node_placement.py [--json] [--seeds 1-10] [--arrivals 2000] [--horizon 2]
                                             [--policies greedy,gpuallocator,kubegpu,optimum]
                                             [--topologies dgx1-v100,...]

One node of each shipped topology (``devices/topologies/*.json``) receives, per seed, a stream of
``--arrivals`` pods: one arrival per time step, sizes 1/2/4/8 GPUs with probabilities 0.4/0.3/0.2/0.1
(sizes larger than the machine are left out and the rest renormalised), lifetimes exponential with the
mean that offers ``LOAD`` x the node's GPUs (so the node is often nearly full, and GPUs come back in
arbitrary places). ``REQUIRE_SHARE`` of the multi-GPU pods REQUIRE an all-NVLink set, where the idle
machine has one of that size. Departures are processed before each arrival; a pod that gets no set is
refused (dropped). Every policy sees the same streams.

Policies (the node's free GPUs in, a set out):

- ``greedy``: the best-connected set for the pod at hand (``topology.greedy_gpu_set``, kubegpu's rule
  before the look-ahead);
- ``gpuallocator``: NVIDIA go-gpuallocator's best-effort policy (``scheduler.core.besteffort``);
- ``kubegpu``: ``topology.best_gpu_set``, the default;
- ``optimum``: an oracle that knows the next ``--horizon`` arrivals and the departures until then and
  tries every set for the pod and each of them (brute force; the last level uses the best own set),
  maximising the sum of their link qualities (a refusal counts -1); ties go to kubegpu's preference.

Per (topology, policy), over all seeds:

- ``mean_link_score``: mean over placed multi-GPU pods of their set's link score (go-gpuallocator's
  pair scores summed: 100 per NVLink plus the PCIe relation, PIX 50 ... SYS 10);
- ``all_nvlink_share``: placed multi-GPU pods whose every pair is NVLink-connected;
- ``cross_socket_share``: placed multi-GPU pods with a pair across the sockets (PCIe SYS);
- ``refused_with_free``: pods refused while at least as many GPUs as they asked for were free;
- ``mean_choice_ms``: wall time per choice, memos starting empty per (topology, policy) run.

Without ``--json`` prints a table with two more columns: ``rel_link`` (each multi-GPU pod's link
score divided by the best set of its size on the idle machine, averaged, so every size weighs the
same) and ``max_choice_ms`` (the slowest choice, usually the first on a machine shape, which fills
the tables). With ``--json`` only ``{"results": [{"topology", "policy", "mean_link_score",
"all_nvlink_share", "cross_socket_share", "refused_with_free", "mean_choice_ms"}, ...]}``.

``--cold`` instead times the choices no memo helps (``COLD_REPEATS`` times each, the median and
the largest): ``first_ms`` the first choice on a fresh link matrix (an idle node, 2 GPUs, filling the
partition tables), ``new_state_ms`` a choice for a free set not seen before once the tables exist
(every 6-GPU free set of an 8-GPU machine, 2 GPUs). ``--json`` then prints ``{"cold": [{"topology",
"policy", "first_ms", "first_max_ms", "new_state_ms", "new_state_max_ms"}, ...]}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devices.model import DeviceKind  # noqa: E402
from scheduler.core.besteffort import gpuallocator_gpu_set  # noqa: E402
from scheduler.core.request import TopologyWish, Wish  # noqa: E402
from scheduler.core.topology import (  # noqa: E402
    NO_WISH,
    Choice,
    LinkMatrix,
    best_gpu_set,
    greedy_gpu_set,
    load_machine,
)

TOPOLOGY_DIR = ROOT / "devices" / "topologies"
SIZES = ((1, 0.4), (2, 0.3), (4, 0.2), (8, 0.1))
LOAD = 1.0  # offered GPU load, in multiples of the node's GPUs
REQUIRE_SHARE = 0.3  # multi-GPU pods that REQUIRE an all-NVLink set (where the machine has one)
NVLINK = TopologyWish(nvlink=Wish.REQUIRE)
POLICIES = ("greedy", "gpuallocator", "kubegpu", "optimum")
COLD_REPEATS = 21


@dataclass(frozen=True)
class Pod:
    arrival: int
    end: int
    size: int
    wish: TopologyWish


def make_links(path: Path) -> LinkMatrix:
    """A fresh (unshared, empty-memo) link matrix of one machine."""
    inventory = load_machine(path)
    gpus = sorted(inventory.by_kind(DeviceKind.GPU), key=lambda d: d.index)
    return LinkMatrix([g.id for g in gpus], [g.numa_node for g in gpus], inventory.topology)


def stream(links: LinkMatrix, seed: int, arrivals: int) -> list[Pod]:
    """The seeded pod stream for one machine."""
    rng = random.Random(seed)
    sizes = [(s, w) for s, w in SIZES if s <= links.n]
    total = sum(w for _, w in sizes)
    mean_size = sum(s * w for s, w in sizes) / total
    mean_life = LOAD * links.n / mean_size
    idle = range(links.n)
    nvlink_sizes = {s for s, _ in sizes if s > 1 and best_gpu_set(links, idle, s, NVLINK) is not None}
    pods = []
    for t in range(arrivals):
        size = rng.choices([s for s, _ in sizes], [w for _, w in sizes])[0]
        life = max(1, round(rng.expovariate(1.0 / mean_life)))
        wish = NVLINK if size in nvlink_sizes and rng.random() < REQUIRE_SHARE else NO_WISH
        pods.append(Pod(t, t + life, size, wish))
    return pods


class Quality:
    """Link facts of sets of one machine, by bitmask: score relative to the idle machine's best."""

    def __init__(self, links: LinkMatrix) -> None:
        self.links = links
        # by brute force, independent of the policies under test (every shipped machine has <= 8 GPUs)
        self.ideal = {
            k: max(links.set_score(c) for c in itertools.combinations(range(links.n), k))
            for k in range(1, links.n + 1)
        }
        self._best: dict[tuple[int, int, TopologyWish], float] = {}

    def of(self, gpus: Sequence[int]) -> float:
        ideal = self.ideal[len(gpus)]
        return self.links.set_score(gpus) / ideal if ideal else 1.0

    def best(self, free: int, k: int, wish: TopologyWish) -> float:
        """The value the oracle's last level gets: the best own set's quality, or -1 if refused."""
        key = (free, k, wish)
        if key not in self._best:
            chosen = greedy_gpu_set(self.links, _bits(free), k, wish)
            self._best[key] = -1.0 if chosen is None else (self.of(chosen) if k > 1 else 0.0)
        return self._best[key]


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _mask(gpus: Sequence[int]) -> int:
    m = 0
    for g in gpus:
        m |= 1 << g
    return m


class Oracle:
    """Brute force over the next ``horizon`` arrivals of a known stream."""

    def __init__(self, links: LinkMatrix, pods: list[Pod], horizon: int) -> None:
        self.links = links
        self.pods = pods
        self.horizon = horizon
        self.quality = Quality(links)
        self.held: dict[int, int] = {}  # pod index -> mask, of the pods running in the real stream

    def candidates(self, free: int, pod: Pod) -> list[tuple[int, ...]]:
        """Every set meeting the pod's REQUIRE wishes, kubegpu's choice first."""
        links = self.links
        first = best_gpu_set(links, _bits(free), pod.size, pod.wish)
        if first is None:
            return []
        out = [first]
        need = links.required_count(pod.wish)
        for cand in itertools.combinations(_bits(free), pod.size):
            if cand != first and (not need or links.satisfies(cand, pod.wish, Wish.REQUIRE) >= need):
                out.append(cand)
        return out

    def value(self, i: int, free: int, mine: tuple[tuple[int, int], ...], depth: int) -> float:
        """Best total quality of pods i..i+depth given the free mask just before pod i's departures."""
        pod = self.pods[i]
        for end, mask in mine:
            if end <= pod.arrival:
                free |= mask
        mine = tuple((e, m) for e, m in mine if e > pod.arrival)
        before = self.pods[i - 1].arrival
        for j, mask in self.held.items():  # real pods leaving since the previous arrival
            if before < self.pods[j].end <= pod.arrival:
                free |= mask
        if depth == 0 or i + 1 >= len(self.pods):
            return self.quality.best(free, pod.size, pod.wish)
        best = -1.0 + self.value(i + 1, free, mine, depth - 1)  # refused
        for cand in self.candidates(free, pod):
            m = _mask(cand)
            q = self.quality.of(cand) if pod.size > 1 else 0.0
            v = q + self.value(i + 1, free & ~m, (*mine, (pod.end, m)), depth - 1)
            if v > best:
                best = v
        return best

    def choose(self, i: int, free: int) -> Choice:
        pod = self.pods[i]
        best: Choice = None
        best_value = -float("inf")
        for cand in self.candidates(free, pod):
            m = _mask(cand)
            q = self.quality.of(cand) if pod.size > 1 else 0.0
            if i + 1 < len(self.pods) and self.horizon:
                q += self.value(i + 1, free & ~m, ((pod.end, m),), self.horizon - 1)
            if q > best_value + 1e-12:
                best, best_value = tuple(cand), q
        return best


@dataclass
class Tally:
    multi: int = 0
    link: float = 0.0
    nvlink: int = 0
    cross: int = 0
    refused_with_free: int = 0
    choices: int = 0
    seconds: float = 0.0
    relative: float = 0.0
    slowest: float = 0.0


def run(links: LinkMatrix, policy: str, pods: list[Pod], horizon: int, tally: Tally) -> None:
    """Play one stream on one node with one policy, adding to ``tally``."""
    quality = Quality(links)
    choose: Callable[[list[int], int, TopologyWish], Choice] | None = {
        "greedy": lambda free, k, wish: greedy_gpu_set(links, free, k, wish),
        "gpuallocator": lambda free, k, wish: gpuallocator_gpu_set(links, free, k, wish),
        "kubegpu": lambda free, k, wish: best_gpu_set(links, free, k, wish),
    }.get(policy)
    oracle = Oracle(links, pods, horizon) if policy == "optimum" else None
    free = (1 << links.n) - 1
    running: dict[int, int] = {}  # pod index -> mask
    for i, pod in enumerate(pods):
        for j in [j for j in running if pods[j].end <= pod.arrival]:
            free |= running.pop(j)
        start = time.perf_counter()
        if oracle is not None:
            oracle.held = running
            chosen = oracle.choose(i, free)
        else:
            assert choose is not None
            chosen = choose(_bits(free), pod.size, pod.wish)
        spent = time.perf_counter() - start
        tally.seconds += spent
        tally.slowest = max(tally.slowest, spent)
        tally.choices += 1
        if chosen is None:
            if free.bit_count() >= pod.size:
                tally.refused_with_free += 1
            continue
        mask = _mask(chosen)
        assert len(chosen) == pod.size and mask & free == mask, (policy, chosen, _bits(free))
        free &= ~mask
        running[i] = mask
        if pod.size > 1:
            tally.multi += 1
            tally.link += links.set_score(chosen)
            tally.relative += quality.of(chosen)
            pairs = [(a, b) for a in chosen for b in chosen if a < b]
            tally.nvlink += all(links.nvlink[a][b] for a, b in pairs)
            tally.cross += any(links.cross[a][b] for a, b in pairs)


def cold(paths: Sequence[Path], policies: Sequence[str], as_json: bool) -> None:
    """Times of the choices no memo serves (see the module docstring), per machine and policy."""
    choosers: dict[str, Callable[..., Choice]] = {
        "greedy": greedy_gpu_set,
        "gpuallocator": gpuallocator_gpu_set,
        "kubegpu": best_gpu_set,
    }
    rows = []
    if not as_json:
        print(f"{'topology':<14}{'policy':<14}{'first ms':>10}{'(max)':>8}{'new state ms':>14}{'(max)':>8}")
    for path in paths:
        for policy in [p for p in policies if p in choosers]:
            choose = choosers[policy]
            first, later = [], []
            for _ in range(COLD_REPEATS):
                links = make_links(path)
                start = time.perf_counter()
                choose(links, range(links.n), min(2, links.n))
                first.append(time.perf_counter() - start)
            for free in itertools.combinations(range(links.n), max(links.n - 2, 2)):
                start = time.perf_counter()
                choose(links, free, min(2, links.n))
                later.append(time.perf_counter() - start)
            row = {
                "topology": path.stem,
                "policy": policy,
                "first_ms": round(1000 * statistics.median(first), 4),
                "first_max_ms": round(1000 * max(first), 4),
                "new_state_ms": round(1000 * statistics.median(later), 4),
                "new_state_max_ms": round(1000 * max(later), 4),
            }
            rows.append(row)
            if not as_json:
                print(
                    f"{path.stem:<14}{policy:<14}{row['first_ms']:>10.3f}{row['first_max_ms']:>8.2f}"
                    f"{row['new_state_ms']:>14.4f}{row['new_state_max_ms']:>8.2f}",
                    flush=True,
                )
    if as_json:
        print(json.dumps({"cold": rows}))


def parse_range(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = (int(v) for v in part.split("-", 1))
            out.extend(range(lo, hi + 1))
        elif part.strip():
            out.append(int(part))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--seeds", default="1-10", help="stream seeds (default %(default)s)")
    parser.add_argument("--arrivals", type=int, default=2000, help="pods per stream (default %(default)s)")
    parser.add_argument("--horizon", type=int, default=2, help="arrivals the optimum looks ahead (default 2)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--topologies", default="", help="shipped topology names (default: all)")
    parser.add_argument("--cold", action="store_true", help="time the choices no memo serves instead")
    args = parser.parse_args(argv)
    try:
        seeds = parse_range(args.seeds)
    except ValueError:
        print(f"node_placement: bad --seeds {args.seeds!r}", file=sys.stderr)
        return 2
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    paths = sorted(TOPOLOGY_DIR.glob("*.json"))
    if args.topologies:
        wanted = args.topologies.split(",")
        paths = [p for p in paths if p.stem in wanted]
        unknown += [w for w in wanted if w not in {p.stem for p in paths}]
    if unknown or not seeds or args.arrivals <= 0 or args.horizon < 0:
        print(f"node_placement: unknown or bad arguments: {', '.join(unknown) or 'counts'}", file=sys.stderr)
        return 2
    if args.cold:
        cold(paths, policies, args.json)
        return 0
    results = []
    if not args.json:
        print(
            f"{'topology':<14}{'policy':<14}{'link':>9}{'nvlink':>9}{'cross':>9}{'refused':>8}"
            f"{'choice ms':>10}{'rel_link':>9}{'max ms':>8}"
        )
    for path in paths:
        for policy in policies:
            links = make_links(path)
            tally = Tally()
            for seed in seeds:
                run(links, policy, stream(make_links(path), seed, args.arrivals), args.horizon, tally)
            multi = max(tally.multi, 1)
            results.append(
                {
                    "topology": path.stem,
                    "policy": policy,
                    "mean_link_score": round(tally.link / multi, 2),
                    "all_nvlink_share": round(tally.nvlink / multi, 4),
                    "cross_socket_share": round(tally.cross / multi, 4),
                    "refused_with_free": tally.refused_with_free,
                    "mean_choice_ms": round(1000 * tally.seconds / max(tally.choices, 1), 4),
                }
            )
            if not args.json:
                r = results[-1]
                print(
                    f"{r['topology']:<14}{r['policy']:<14}{r['mean_link_score']:>9.2f}"
                    f"{r['all_nvlink_share']:>9.4f}{r['cross_socket_share']:>9.4f}{r['refused_with_free']:>8}"
                    f"{r['mean_choice_ms']:>10.4f}{tally.relative / multi:>9.4f}{1000 * tally.slowest:>8.2f}",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
