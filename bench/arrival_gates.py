"""Issue 26: what the arrivals say early, per workload, and where bench/placement_variants.py's gated FGD
variants (``GatedFGD``) score in bands of 1. Reads only the arrival orders (no placements): a gate reads
only what has arrived, so replaying the arrivals through the FGD plugin's ``observe`` is exactly when it
switches in a run.

    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/arrival_gates.py \\
        --names tuning,shared --seeds 42-51 --at 0.02,0.1,0.4 --gates fine-ratio13,fine-multi13

Per workload and point of the GPU capacity arrived (``--at``), the mean [least, most] over the seeds of:
``ratio``, the CPU asked over the cluster's CPU over the GPU milli asked over its GPU milli; ``multi``, pods
of 2 or more whole GPUs' share of the GPU milli asked; ``share``, sharing pods' share of it. Per gated
variant: on how many seeds it ever scores in bands of 1, the share of the arrivals it scores so (mean
[least, most]) and the most switches in one run. ``--mix-file``: mixes of another file.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import placement_variants as variants  # noqa: E402
import simulate_openb as openb  # noqa: E402
import variant_runs  # noqa: E402

from scheduler.core.policies import DemandTally  # noqa: E402
from scheduler.core.request import MILLI  # noqa: E402
from scheduler.core.state import ClusterState  # noqa: E402
from scheduler.sim.protocol import arrivals, build_cluster  # noqa: E402
from scheduler.sim.runner import parse_seeds  # noqa: E402


def stats_at(order: list, cluster: ClusterState, points: list[float]) -> list[dict]:
    """``ratio``, ``multi`` and ``share`` (see above) once each of ``points`` of the GPU capacity arrived."""
    demand = DemandTally(warm_up=0.0)  # the arrivals' from the first
    demand.bind(cluster, [])
    kinds = [0, 0]
    out: list[dict] = []
    for pod in order:
        demand.observe(pod)
        variants.GatedFGD.add_kind(kinds, pod)
        gpu = demand.asked[1]
        while len(out) < len(points) and gpu >= points[len(out)] * demand.capacity[1]:
            out.append({"ratio": demand.cpu_over_gpu(), "multi": kinds[0] / gpu, "share": kinds[1] / gpu})
    return out


def replay(
    name: str, policy: str, orders: list[list], nodes: list, pods: list
) -> tuple[int, list[float], int]:
    """On how many of the arrival orders ``policy``'s ``GatedFGD`` ever scores in its fine bands,
    the share of the arrivals it scores so, and the most switches in one order."""
    fgd = next(p for p, _ in variants.VARIANTS[policy]().plugins if isinstance(p, variants.GatedFGD))
    cluster = build_cluster(nodes)
    fired, shares, most = 0, [], 0
    for order in orders:
        fgd.bind(cluster, pods, random.Random(0))  # the gate's state afresh for each order
        fine = switches = 0
        last = fgd.step
        for pod in order:
            fgd.observe(pod)
            switches += fgd.step != last
            last = fgd.step
            fine += fgd.step == fgd.fine.step
        fired += fine > 0
        shares.append(fine / len(order))
        most = max(most, switches)
    return fired, shares, most


def spread(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--names", required=True)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--at", default="0.02,0.05,0.1,0.2,0.4")
    parser.add_argument("--gates", default="")
    parser.add_argument("--mix-file", default="")
    args = parser.parse_args(argv)
    variant_runs.register_variants()
    if args.mix_file:
        openb.MIXES = Path(args.mix_file)
    points = [float(x) for x in args.at.split(",")]
    gates = [g for g in args.gates.split(",") if g]
    print("| workload | at | ratio | multi | share |")
    print("|---|---|---|---|---|")
    replays: list[str] = []
    for name in variant_runs.names_of(args.names):
        nodes, pods = openb.load_workload(name)
        cluster = build_cluster(nodes)
        orders = [arrivals(pods, seed, cluster.total_gpus() * MILLI)[0] for seed in parse_seeds(args.seeds)]
        rows = [stats_at(order, cluster, points) for order in orders]
        for k, point in enumerate(points):
            cells = [spread([r[k][key] for r in rows]) for key in ("ratio", "multi", "share")]
            print(f"| {name} | {point:.0%} | " + " | ".join(cells) + " |")
        for gate in gates:
            fired, shares, most = replay(name, gate, orders, nodes, pods)
            replays.append(f"| {name} | {gate} | {fired}/{len(orders)} | {spread(shares)} | {most} |")
    if replays:
        print(
            "\n| workload | variant | seeds in fine bands | share of arrivals in fine bands | most switches |"
        )
        print("|---|---|---|---|---|")
        print("\n".join(replays))
    return 0


if __name__ == "__main__":
    sys.exit(main())
