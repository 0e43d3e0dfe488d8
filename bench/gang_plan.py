"""Benchmark: what the gang planner's fewest-nodes search costs one group decision (issue 21).

``scheduler.core.gang.schedule_group`` runs a greedy pass and, for a group whose every member is
required, a bounded depth-first search when that pass failed or used more nodes than the free GPUs
say could suffice (docs/gang.md). This times one decision, in process, on clusters of ``--nodes``
(default 500 and 5,000) idle nodes, with the search as shipped and with it off
(``SEARCH_BUDGET = 0``, the greedy pass alone), interleaved decision by decision so that machine
noise hits both alike. Three groups:

- ``one-node``: 8 one-GPU members on 8-GPU nodes (bench/gang_throughput.py's groups): the greedy
  plan is on one node, so the search never runs (the ratio shows it costs nothing);
- ``split``: 2 four-GPU members on nodes of 4, 8 and 6 GPUs repeated (the greedy pass splits the
  group; the search puts it on one 8-GPU node);
- ``worst``: six 3-GPU and six 2-GPU members on 4-GPU nodes (a 3 and a 2 never share a node, so
  no plan beats 9 nodes, while the free-GPU bound says 8 could do: the search spends its whole
  budget and the greedy plan stands).

Usage: ``python bench/gang_plan.py [--json] [--nodes N ...] [--repeat N]``. Prints a table and one
JSON object (only the JSON object with ``--json``): per group and cluster size, the median
milliseconds with and without the search, their ratio, and the nodes each plan used.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import scheduler.core.gang as gang  # noqa: E402
from scheduler.core import ClusterState, GpuState, NodeState, PodRequest, make_policy  # noqa: E402
from scheduler.core.gang import GroupPlacement, GroupRequest, schedule_group  # noqa: E402


def _node(name: str, gpus: int) -> NodeState:
    return NodeState(name, 64_000, 512_000, [GpuState(i, f"{name}-g{i}", "H100", 81920) for i in range(gpus)])


def _group(demands: list[int]) -> GroupRequest:
    members = tuple(
        PodRequest(f"ml/m{k}", uid=f"m{k}", cpu_milli=100, gpu_count=g) for k, g in enumerate(demands)
    )
    return GroupRequest("ml/g", len(demands), members, domain_key=None)


CASES: dict[str, tuple[Callable[[int], list[int]], list[int]]] = {
    "one-node": (lambda n: [8] * n, [1] * 8),
    "split": (lambda n: [(4, 8, 6)[i % 3] for i in range(n)], [4, 4]),
    "worst": (lambda n: [4] * n, [3] * 6 + [2] * 6),
}


def measure(case: str, nodes: int, repeat: int) -> dict[str, object]:
    shape, demands = CASES[case]
    cluster = ClusterState([_node(f"n{i}", g) for i, g in enumerate(shape(nodes))])
    group = _group(demands)
    policy = make_policy("topology")
    policy.bind(cluster, list(group.members), random.Random(0))
    budget = gang.SEARCH_BUDGET
    times: dict[str, list[float]] = {"search": [], "greedy": []}
    used: dict[str, int | None] = {}
    for _ in range(repeat):
        for kind in ("search", "greedy"):
            gang.SEARCH_BUDGET = budget if kind == "search" else 0
            started = time.perf_counter()
            result = schedule_group(group, cluster, policy, random.Random(1))
            times[kind].append((time.perf_counter() - started) * 1000)
            used[kind] = len(result.nodes) if isinstance(result, GroupPlacement) else None
    gang.SEARCH_BUDGET = budget
    search, greedy = statistics.median(times["search"]), statistics.median(times["greedy"])
    return {
        "group": case,
        "nodes": nodes,
        "search_ms_p50": round(search, 2),
        "greedy_ms_p50": round(greedy, 2),
        "ratio": round(search / greedy, 2),
        "plan_nodes_search": used["search"],
        "plan_nodes_greedy": used["greedy"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    rows = [measure(case, n, args.repeat) for n in args.nodes for case in CASES]
    out = {"search_budget": gang.SEARCH_BUDGET, "search_pool": gang.SEARCH_POOL, "rows": rows}
    if not args.json:
        head = ("group", "nodes", "search ms", "greedy ms", "ratio", "plan nodes")
        print(f"{head[0]:<9} {head[1]:>6} {head[2]:>10} {head[3]:>10} {head[4]:>6} {head[5]:>14}")
        for r in rows:
            plan = f"{r['plan_nodes_search']} vs {r['plan_nodes_greedy']}"
            print(f"{r['group']:<9} {r['nodes']:>6} {r['search_ms_p50']:>10} {r['greedy_ms_p50']:>10} "
                  f"{r['ratio']:>6} {plan:>14}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
