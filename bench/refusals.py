"""Which pods a policy refuses early on a workload, and what fills each GPU model's nodes: one run of the
simulator's protocol (``run_once``, its ``on_try`` hook) per policy, on one seed (issue 26's diagnoses).

    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/refusals.py \\
        --workload t-spec25-cpu3-mg20 --seed 45 --policies fgd,fgd-reserve,guard-v3 [--upto 45] \\
        [--snapshots 15,35] [--first 12] [--json]

Workloads are bench/simulate_openb.py's (a shared trace or a mix of bench/openb_mixes.json); policies
its names or bench/placement_variants.py's. Per policy: the pods refused until ``--upto`` % of the GPU
capacity has arrived (how many, the first ``--first`` with the arrived % and shape), and at each
snapshot (arrived %) per GPU model its nodes, free GPU and CPU shares, and the pods placed on them by
kind (CPU-only, shares, whole GPUs; free to use any model or restricted): pods, GPUs, CPU cores.
Prints a short table per policy, then one JSON object (only that with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.core import policies as core_policies  # noqa: E402
from scheduler.core.request import MILLI, PodRequest  # noqa: E402
from scheduler.core.schedule import Placement  # noqa: E402
from scheduler.core.state import ClusterState  # noqa: E402
from scheduler.sim.protocol import run_once  # noqa: E402
from tests.support.benchscript import bench_module  # noqa: E402


def kind(pod: PodRequest) -> str:
    """``cpu-only``, or ``free``/``restricted`` and ``share``/``N-GPU``."""
    if not pod.gpu_count:
        return "cpu-only"
    who = "restricted" if pod.gpu_models else "free"
    return f"{who} share" if pod.is_share else f"{who} {pod.gpu_count}-GPU"


def shape(pod: PodRequest) -> str:
    models = ",".join(sorted(pod.gpu_models))
    return f"{pod.gpu_count}x{pod.gpu_milli} milli, {pod.cpu_milli // 1000} CPU" + (
        f", {models}" if models else ""
    )


def model_of(cluster: ClusterState, i: int) -> str:
    models = cluster.model_sets[int(cluster.model_code[i])]
    return ",".join(sorted(models)) or "none"


def model_shares(cluster: ClusterState) -> dict[str, dict]:
    """Per GPU model: nodes, free GPU share, free CPU share (rounded to 3 decimals)."""
    out = {}
    for code, models in enumerate(cluster.model_sets):
        rows = np.flatnonzero(cluster.model_code == code)
        gpus = int(cluster.gpu_count[rows].sum()) * MILLI
        if not len(rows) or not gpus:
            continue
        cpu = int(cluster.cpu_capacity[rows].sum())
        out[",".join(sorted(models))] = {
            "nodes": len(rows),
            "gpu_free": round(int(cluster.gpu_free_total[rows].sum()) / gpus, 3),
            "cpu_free": round(int(cluster.cpu_free[rows].sum()) / cpu, 3) if cpu else None,
        }
    return out


def replay(
    nodes: Sequence,
    pods: Sequence[PodRequest],
    policy: str,
    seed: int,
    upto: float,
    snapshots: Sequence[float],
) -> dict:
    """One run: refusals until ``upto`` % arrived, and per snapshot the models' shares and what they hold."""
    refused: list[tuple[float, PodRequest]] = []
    placed: dict[str, dict[str, list[int]]] = {}  # model -> kind -> [pods, GPUs, CPU cores], to the first
    taken: dict[float, dict] = {}
    pending = sorted(snapshots)
    first = pending[0] if pending else -1.0  # the pods placed are tallied up to the first snapshot

    def on_try(pod: PodRequest, where: Placement | None, cluster: ClusterState, arrived: float) -> None:
        if arrived > upto and not pending:
            return
        if where is None:
            if arrived <= upto:
                refused.append((arrived, pod))
        elif arrived <= first:
            tally = placed.setdefault(model_of(cluster, cluster.index[where.node]), {}).setdefault(
                kind(pod), [0, 0, 0]
            )
            tally[0] += 1
            tally[1] += pod.total_gpu_milli // MILLI
            tally[2] += pod.cpu_milli // 1000
        while pending and arrived >= pending[0]:
            taken[pending.pop(0)] = model_shares(cluster)

    run_once(nodes, pods, policy, seed, on_try=on_try)
    return {
        "refused": len(refused),
        "refusals": [{"arrived_pct": round(a, 1), "pod": shape(p)} for a, p in refused],
        "snapshots": {f"{k:g}": v for k, v in taken.items()},
        "placed_by_first_snapshot": placed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--policies", default="fgd,fgd-reserve")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--upto", type=float, default=45.0, help="arrived %% up to which refusals are listed")
    parser.add_argument("--snapshots", default="15,35", help="arrived %%s at which the models are looked at")
    parser.add_argument("--first", type=int, default=12, help="refusals printed per policy")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    variants = bench_module("placement_variants.py", "placement_variants_refusals")
    core_policies.POLICIES.update(variants.VARIANTS)
    bench = bench_module("simulate_openb.py", "simulate_openb_refusals")
    nodes, pods = bench.load_workload(args.workload)
    snapshots = [float(x) for x in args.snapshots.split(",") if x]
    out = {
        "workload": args.workload,
        "seed": args.seed,
        "upto_pct": args.upto,
        "policies": {
            p: replay(nodes, pods, p, args.seed, args.upto, snapshots) for p in args.policies.split(",") if p
        },
    }
    if not args.json:
        for policy, run in out["policies"].items():
            print(f"## {policy}: {run['refused']} pods refused by {args.upto:g}% arrived")
            for r in run["refusals"][: args.first]:
                print(f"  {r['arrived_pct']:5.1f}%  {r['pod']}")
            for at, models in run["snapshots"].items():
                cells = ", ".join(f"{m} {v['gpu_free']:.2f}/{v['cpu_free']:.2f}" for m, v in models.items())
                print(f"  at {at}% arrived, free GPU/CPU share: {cells}")
            for model, kinds in sorted(run["placed_by_first_snapshot"].items()):
                cells = ", ".join(
                    f"{k} {v[0]} pods {v[1]} GPUs {v[2]} CPUs" for k, v in sorted(kinds.items())
                )
                print(f"  on {model} by {snapshots[0]:g}%: {cells}" if snapshots else "")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
