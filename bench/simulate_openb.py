"""Every policy on the four openb traces: GPU allocation at 100% and 130% arrived, beside the paper.

    .venv/bin/python bench/simulate_openb.py [--seeds 42-51] [--traces default,...] [--policies ...]
                                             [--jobs N] [--markdown] [--ties node-order|random]
    .venv/bin/python bench/simulate_openb.py --scaling 1,2,4,8 [--policies bestfit,fgd,fgd-align]
    .venv/bin/python bench/simulate_openb.py --throughput [--policies ...]
    .venv/bin/python bench/simulate_openb.py --links [--policies ...]      # + link quality columns
    .venv/bin/python bench/simulate_openb.py --bound [--policies fgd,...]   # + the LP bound per trace
    .venv/bin/python bench/simulate_openb.py --mixes tuning|heldout [--policies fgd,fgd-reserve] [--bound]

Prints, per trace and policy, the mean and spread (sample standard deviation) over the seeds of the
GPU allocation ratio at 100% and 130% arrived, the published value (FGD paper, mean of 10 seeds),
the wall time of one run (mean and max, each run on one core), and our policy minus FGD paired by
seed. ``--scaling`` instead times one run (seed 42, default trace) on the openb cluster and workload
replicated k times (k x 1,213 nodes, k x 8,152 pods), to show how the cost grows.
``--throughput`` times ``schedule_one`` + ``assume`` (reasons collected for unschedulable pods) on
5,000 nodes x 8 GPUs for 20,000 pods drawn from the default trace. Needs ../shared/traces/openb.

Nodes get the links of ``kubegpu simulate``'s default machine shapes (``scheduler.sim.machines``);
``--links`` adds, per trace and policy, the link quality of the multi-GPU pods (mean link score, its
ratio to the idle node's best set, all-NVLink and cross-socket shares). ``--bound`` adds, per trace,
the mean over the seeds of the LP upper bound on the allocation at 100% and 130% arrived
(``scheduler.sim.bound``) and every policy's gap to it. ``--curve`` prints, for the default policy
against FGD, the smallest difference of the mean curves over every arrival point 10%..130% (and how
many points are below FGD), then both mean curves at ``CURVE_POINTS`` as a markdown table.
``--mixes SET`` runs instead the trace mixes of that set of ``MIXES`` (``scheduler.sim.mixes``; each
mix with its own protocol seeds) and prints, per mix and policy, the means at 100% and 130%, and for
every policy but FGD: the smallest paired difference to FGD at 100% and 130% over the seeds, the
smallest difference of the mean curves over 10..130% (where, and how many points are below FGD);
with ``--bound``, then each mix's LP bound and every policy's gap to it at 130%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.core.policies import DEFAULT_POLICY, POLICIES  # noqa: E402
from scheduler.sim.machines import DEFAULT_SHAPES, resolve  # noqa: E402
from scheduler.sim.protocol import RunResult, run_once  # noqa: E402
from scheduler.sim.runner import parse_seeds  # noqa: E402
from scheduler.sim.trace import load_nodes, load_pods, with_shapes  # noqa: E402

# ../shared beside the checkout; OPENB_TRACES names another place (a worktree's ../shared is elsewhere)
TRACE_DIR = Path(os.environ.get("OPENB_TRACES") or ROOT.parent / "shared" / "traces" / "openb")
TRACES = ("default", "cpu050", "multigpu20", "gpushare40")
MIXES = ROOT / "bench" / "openb_mixes.json"  # the tuning and held-out trace mixes (--mixes)
CURVE_POINTS = (10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 100, 105, 110, 120, 130)  # --curve's table

# Weng et al., "Beware of Fragmentation", USENIX ATC'23: mean of 10 seeds, alloc % at 100 / 130 arrived
PUBLISHED: dict[str, dict[str, tuple[float, float]]] = {
    "default": {
        "random": (86.30, 87.47),
        "dotprod": (90.62, 90.85),
        "gpuclustering": (91.65, 91.88),
        "gpupacking": (91.78, 92.00),
        "bestfit": (92.86, 93.08),
        "fgd": (95.23, 95.39),
    },
    "cpu050": {
        "random": (89.02, 91.24),
        "dotprod": (93.03, 93.27),
        "gpuclustering": (93.52, 93.79),
        "gpupacking": (93.46, 93.72),
        "bestfit": (93.56, 93.79),
        "fgd": (95.00, 95.21),
    },
    "multigpu20": {
        "random": (86.92, 88.69),
        "dotprod": (91.85, 92.06),
        "gpuclustering": (93.34, 93.56),
        "gpupacking": (93.50, 93.71),
        "bestfit": (93.73, 93.93),
        "fgd": (95.53, 95.65),
    },
    "gpushare40": {
        "random": (84.86, 86.00),
        "dotprod": (89.30, 89.56),
        "gpuclustering": (89.76, 90.02),
        "gpupacking": (89.77, 90.03),
        "bestfit": (91.44, 91.69),
        "fgd": (93.96, 94.15),
    },
}

_DATA: dict[str, tuple] = {}
T = TypeVar("T")


def _load(trace: str) -> tuple:
    if trace not in _DATA:
        _DATA[trace] = (
            with_shapes(load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv"), resolve(DEFAULT_SHAPES)),
            load_pods(TRACE_DIR / f"openb_pod_list_{trace}.csv"),
        )
    return _DATA[trace]


def _job(trace: str, policy: str, seed: int, ties: str) -> tuple[str, str, RunResult]:
    nodes, pods = _load(trace)
    return trace, policy, run_once(nodes, pods, policy, seed, ties=ties)


def _run_all(job: Callable[..., T], work: Sequence[tuple], jobs: int) -> list[T]:
    """``job(*args)`` for every ``args`` of ``work``, in order: in ``jobs`` worker processes when more
    than 1, else here."""
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            return list(pool.map(job, *zip(*work, strict=True), chunksize=1))
    return [job(*args) for args in work]


_MIX_DATA: dict[str, tuple] = {}


def _load_mix(name: str) -> tuple:
    from scheduler.sim.mixes import load_mixes

    if name not in _MIX_DATA:
        mix = next(m for ms in load_mixes(MIXES).values() for m in ms if m.name == name)
        nodes, pods = _load(mix.trace)
        _MIX_DATA[name] = (nodes, mix.build(pods, nodes))
    return _MIX_DATA[name]


def load_workload(name: str) -> tuple:
    """(nodes, pods) of a shared trace (``TRACES``) or of a mix of ``MIXES``, loaded once per process."""
    return _load(name) if name in TRACES else _load_mix(name)


def curve_margin(
    ours: Sequence[Callable[[int], float]], fgd: Sequence[Callable[[int], float]]
) -> tuple[int, float, int]:
    """Over the arrival points 10..130%: the point where the mean of the curves ``ours`` (each the
    allocated % at an arrived %) is furthest below the mean of ``fgd``'s, that difference, and at how
    many of the 121 points it is below by more than 0.005."""
    diffs = {
        x: statistics.fmean(c(x) for c in ours) - statistics.fmean(c(x) for c in fgd) for x in range(10, 131)
    }
    worst = min(diffs, key=lambda x: diffs[x])
    return worst, diffs[worst], sum(1 for d in diffs.values() if d < -0.005)


def _mix_job(mix: str, policy: str, seed: int, ties: str) -> tuple[str, str, RunResult]:
    nodes, pods = _load_mix(mix)
    return mix, policy, run_once(nodes, pods, policy, seed, ties=ties)


def mixes_table(
    results: dict[tuple[str, str], list[RunResult]], mixes: list[str], policies: list[str]
) -> None:
    """Markdown: per mix and policy, means at 100/130 and (policies other than fgd) the margins to fgd."""
    print(
        "| mix | policy | @100 | @130 | min seed diff @100 / @130 | mean diff @100 / @130 "
        "| curve min diff (at %) | points below fgd |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mix in mixes:
        fgd = results.get((mix, "fgd"))
        for policy in policies:
            runs = results[(mix, policy)]
            m100 = statistics.fmean(r.alloc_pct_at_100 for r in runs)
            m130 = statistics.fmean(r.alloc_pct_at_130 for r in runs)
            cells = [mix, policy, f"{m100:.2f}", f"{m130:.2f}"]
            if fgd is None or policy == "fgd":
                cells += ["-", "-", "-", "-"]
            else:
                d100 = [a.alloc_pct_at_100 - b.alloc_pct_at_100 for a, b in zip(runs, fgd, strict=True)]
                d130 = [a.alloc_pct_at_130 - b.alloc_pct_at_130 for a, b in zip(runs, fgd, strict=True)]
                worst, margin, below = curve_margin([r.at for r in runs], [r.at for r in fgd])
                cells += [
                    f"{min(d100):+.2f} / {min(d130):+.2f}",
                    f"{statistics.fmean(d100):+.2f} / {statistics.fmean(d130):+.2f}",
                    f"{margin:+.2f} ({worst})",
                    f"{below}/121",
                ]
            print("| " + " | ".join(cells) + " |", flush=True)


def _bound_job(trace: str, seed: int) -> tuple[str, int, dict[int, float]]:
    from scheduler.sim.bound import protocol_bounds

    nodes, pods = load_workload(trace)
    return trace, seed, {x: b.bound_pct for x, b in protocol_bounds(nodes, pods, seed, 1.3).items()}


def mix_bounds_table(
    results: dict[tuple[str, str], list[RunResult]],
    bounds: dict[str, list[dict[int, float]]],
    mixes: list[str],
    policies: list[str],
) -> None:
    """Markdown: per mix, the mean LP bound at 100/130 over its seeds, each policy's gap to it at
    130, and FGD's headroom at 130 (bound minus FGD: the most any policy can be above FGD there)."""
    head = ["mix", "bound @100", "bound @130"] + [f"{p} gap @130" for p in policies]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for mix in mixes:
        b100 = statistics.fmean(b[100] for b in bounds[mix])
        b130 = statistics.fmean(b[130] for b in bounds[mix])
        cells = [mix, f"{b100:.2f}", f"{b130:.2f}"]
        for policy in policies:
            m130 = statistics.fmean(r.alloc_pct_at_130 for r in results[(mix, policy)])
            cells.append(f"{b130 - m130:.2f}")
        print("| " + " | ".join(cells) + " |", flush=True)


def scaling(factors: list[int], policies: list[str]) -> None:
    """One run per (factor, policy) on the default trace with nodes and pods replicated."""
    from dataclasses import replace

    nodes, pods = _load("default")
    print("| nodes | pods arrived | policy | seconds | pods/s | alloc % @130 |")
    print("|---|---|---|---|---|---|")
    for k in factors:
        many_nodes = [replace(n, name=f"{n.name}-{r}") for r in range(k) for n in nodes]
        many_pods = [replace(p, name=f"{p.name}-{r}", uid=f"{p.uid}-{r}") for r in range(k) for p in pods]
        for policy in policies:
            run = run_once(many_nodes, many_pods, policy, 42)
            print(
                f"| {len(many_nodes)} | {run.pods} | {policy} | {run.seconds:.2f} "
                f"| {run.pods / run.seconds:.0f} | {run.alloc_pct_at_130:.2f} |",
                flush=True,
            )


def throughput(policies: list[str], nodes: int = 5000, pods: int = 20_000) -> None:
    """Pods per second of the core on a large homogeneous cluster (96 CPUs, 384 GiB, 8 GPUs each)."""
    import random
    from dataclasses import replace

    from scheduler.core import Placement, make_policy, schedule_one
    from scheduler.sim.trace import NodeSpec, build_cluster

    trace = _load("default")[1]
    rng = random.Random(0)
    work = [replace(rng.choice(trace), name=f"p{i}", uid=f"p{i}") for i in range(pods)]
    specs = [NodeSpec(f"n{i}", 96_000, 393_216, 8, "G2") for i in range(nodes)]
    print("| policy | nodes | pods | placed | seconds | pods/s |")
    print("|---|---|---|---|---|---|")
    for policy_name in policies:
        cluster = build_cluster(specs)
        policy = make_policy(policy_name)
        policy.bind(cluster, trace, random.Random(1))
        placed = 0
        start = time.perf_counter()
        for pod in work:
            result = schedule_one(pod, cluster, policy, rng)
            if isinstance(result, Placement):
                cluster.assume(result.allocation)
                placed += 1
        seconds = time.perf_counter() - start
        print(
            f"| {policy_name} | {nodes} | {pods} | {placed} | {seconds:.2f} | {pods / seconds:.0f} |",
            flush=True,
        )


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (each run is single-threaded)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument(
        "--ties",
        choices=("node-order", "random"),
        default="node-order",
        help="equal scores: seeded node order (the FGD simulator, default) or at random (kube-scheduler)",
    )
    parser.add_argument("--scaling", metavar="K,K,...", help="time runs on openb replicated K times instead")
    parser.add_argument("--throughput", action="store_true", help="pods/s on 5,000 nodes x 8 GPUs instead")
    parser.add_argument("--links", action="store_true", help="add the link quality of multi-GPU pods")
    parser.add_argument("--bound", action="store_true", help="add the LP upper bound and the gaps to it")
    parser.add_argument(
        "--mixes", metavar="SET", help="run the trace mixes of this set of bench/openb_mixes.json"
    )
    parser.add_argument("--mix-names", metavar="NAME,...", help="with --mixes: only these mixes of the set")
    parser.add_argument(
        "--curve", action="store_true", help="add the default policy's smallest margin over FGD on the curve"
    )
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        print(f"simulate_openb: bad --seeds: {exc}", file=sys.stderr)
        return 2
    traces = [t for t in args.traces.split(",") if t]
    policies = [p for p in args.policies.split(",") if p]
    unknown = [t for t in traces if t not in TRACES] + [p for p in policies if p not in POLICIES]
    if unknown or not traces or not policies or args.jobs < 1:
        print(f"simulate_openb: unknown or bad arguments: {', '.join(unknown) or 'counts'}", file=sys.stderr)
        return 2
    if not TRACE_DIR.is_dir():
        print(f"no openb trace at {TRACE_DIR}", file=sys.stderr)
        return 2
    if args.scaling:
        scaling([int(k) for k in args.scaling.split(",")], policies)
        return 0
    if args.throughput:
        throughput(policies)
        return 0
    if args.mixes:
        names = [n for n in (args.mix_names or "").split(",") if n]
        return run_mixes(args.mixes, policies, args.jobs, args.ties, names, args.bound)
    jobs = [(t, p, s, args.ties) for t in traces for p in policies for s in seeds]
    start = time.perf_counter()
    results: dict[tuple[str, str], list[RunResult]] = {}
    for trace, policy, run in _run_all(_job, jobs, args.jobs):
        results.setdefault((trace, policy), []).append(run)
    bounds: dict[str, list[dict[int, float]]] = {}
    if args.bound:
        bound_jobs = [(t, s) for t in traces for s in seeds]
        for trace, _seed, by_point in _run_all(_bound_job, bound_jobs, args.jobs):
            bounds.setdefault(trace, []).append(by_point)
    total = time.perf_counter() - start

    if args.links or args.bound:
        extra_table(traces, policies, results, bounds, args.links)
        print()
    if args.markdown:
        print("| trace | policy | @100 mean ± sd | @130 mean ± sd | published @100 / @130 |", end="")
        print(" run s (mean / max) |")
        print("|---|---|---|---|---|---|")
    else:
        print(f"{'trace':<11}{'policy':<14}{'@100':>14}{'@130':>14}{'published':>16}{'run s':>14}")
    for trace in traces:
        for policy in policies:
            runs = results[(trace, policy)]
            m100, s100 = _stats([r.alloc_pct_at_100 for r in runs])
            m130, s130 = _stats([r.alloc_pct_at_130 for r in runs])
            pub = PUBLISHED.get(trace, {}).get(policy)
            pub_text = f"{pub[0]:.2f} / {pub[1]:.2f}" if pub else "-"
            secs = [r.seconds for r in runs]
            if args.markdown:
                print(
                    f"| {trace} | {policy} | {m100:.2f} ± {s100:.2f} | {m130:.2f} ± {s130:.2f} | {pub_text} "
                    f"| {statistics.fmean(secs):.2f} / {max(secs):.2f} |"
                )
            else:
                print(
                    f"{trace:<11}{policy:<14}{m100:>8.2f}±{s100:<5.2f}{m130:>8.2f}±{s130:<5.2f}"
                    f"{pub_text:>16}{statistics.fmean(secs):>7.2f}/{max(secs):<6.2f}"
                )
    if "fgd" in policies and DEFAULT_POLICY in policies and DEFAULT_POLICY != "fgd":
        print(f"\n{DEFAULT_POLICY} minus fgd at 130% arrived, paired by seed:")
        for trace in traces:
            diffs = [
                a.alloc_pct_at_130 - b.alloc_pct_at_130
                for a, b in zip(results[(trace, DEFAULT_POLICY)], results[(trace, "fgd")], strict=True)
            ]
            wins = sum(d > 0 for d in diffs)
            print(
                f"  {trace:<11} mean {statistics.fmean(diffs):+.2f}  min {min(diffs):+.2f}"
                f"  max {max(diffs):+.2f}  better in {wins}/{len(diffs)} seeds"
            )
    if args.curve and "fgd" in policies and DEFAULT_POLICY in policies:
        print(f"\n{DEFAULT_POLICY} minus fgd, mean curves, smallest difference over arrival points 10..130%:")
        for trace in traces:
            ours, fgd = results[(trace, DEFAULT_POLICY)], results[(trace, "fgd")]
            diffs = {
                x: statistics.fmean(r.at(x) for r in ours) - statistics.fmean(r.at(x) for r in fgd)
                for x in range(10, 131)
            }
            worst = min(diffs, key=lambda x: diffs[x])
            below = sum(1 for d in diffs.values() if d < 0)
            print(
                f"  {trace:<11} min {diffs[worst]:+.3f} at {worst}%   points below fgd: {below}/{len(diffs)}"
                f"   at 130%: {diffs[130]:+.2f}"
            )
        print(f"\nmean curves (allocated % at arrived %), {DEFAULT_POLICY} and fgd:")
        print("| trace | policy | " + " | ".join(f"{x}%" for x in CURVE_POINTS) + " |")
        print("|---|---|" + "---|" * len(CURVE_POINTS))
        for trace in traces:
            for policy in ("fgd", DEFAULT_POLICY):
                runs = results[(trace, policy)]
                cells = [f"{statistics.fmean(r.at(x) for r in runs):.2f}" for x in CURVE_POINTS]
                print(f"| {trace} | {policy} | " + " | ".join(cells) + " |")
            ours, fgd = results[(trace, DEFAULT_POLICY)], results[(trace, "fgd")]
            cells = [
                f"{statistics.fmean(r.at(x) for r in ours) - statistics.fmean(r.at(x) for r in fgd):+.2f}"
                for x in CURVE_POINTS
            ]
            print(f"| {trace} | difference | " + " | ".join(cells) + " |")
    print(
        f"\n{len(jobs)} runs ({len(seeds)} seeds, ties: {args.ties}) in {total:.0f} s with {args.jobs} job(s)"
    )
    return 0


def run_mixes(
    set_name: str,
    policies: list[str],
    jobs: int,
    ties: str,
    names: list[str] | None = None,
    bound: bool = False,
) -> int:
    """Every mix of ``set_name`` in ``MIXES`` (or those of ``names``) with every policy over the mix's
    own seeds; with ``bound``, also the LP bound of each mix and seed (``mix_bounds_table``)."""
    from scheduler.sim.mixes import load_mixes

    try:
        sets = load_mixes(MIXES)
        mixes = [m for m in sets[set_name] if not names or m.name in names]
        if not mixes:
            raise KeyError(set_name)
    except KeyError:
        print(f"simulate_openb: no mix set {set_name!r} in {MIXES}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"simulate_openb: {exc}", file=sys.stderr)
        return 2
    work = [(m.name, p, s, ties) for m in mixes for p in policies for s in m.seeds]
    start = time.perf_counter()
    results: dict[tuple[str, str], list[RunResult]] = {}
    for mix, policy, run in _run_all(_mix_job, work, jobs):
        results.setdefault((mix, policy), []).append(run)
    mixes_table(results, [m.name for m in mixes], policies)
    if bound:
        bounds: dict[str, list[dict[int, float]]] = {}
        for mix, _seed, by_point in _run_all(_bound_job, [(m.name, s) for m in mixes for s in m.seeds], jobs):
            bounds.setdefault(mix, []).append(by_point)
        print()
        mix_bounds_table(results, bounds, [m.name for m in mixes], policies)
    secs = {
        p: statistics.fmean(r.seconds for (m, q), rs in results.items() if q == p for r in rs)
        for p in policies
    }
    print("\nmean run s: " + ", ".join(f"{p} {v:.2f}" for p, v in secs.items()))
    print(
        f"{len(work)} runs (set {set_name}, ties: {ties}) in {time.perf_counter() - start:.0f} s"
        f" with {jobs} job(s)"
    )
    return 0


def extra_table(
    traces: list[str],
    policies: list[str],
    results: dict[tuple[str, str], list[RunResult]],
    bounds: dict[str, list[dict[int, float]]],
    links: bool,
) -> None:
    """Markdown: per trace and policy, the link quality and/or the bound and the gaps to it."""
    head = ["trace", "policy", "@100", "@130"]
    if bounds:
        head += ["bound @100", "bound @130", "gap @100", "gap @130"]
    if links:
        head += ["multi-GPU pods", "link score", "of best", "all-NVLink", "across sockets"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for trace in traces:
        b100 = statistics.fmean(b[100] for b in bounds[trace]) if bounds else 0.0
        b130 = statistics.fmean(b[130] for b in bounds[trace]) if bounds else 0.0
        for policy in policies:
            runs = results[(trace, policy)]
            m100 = statistics.fmean(r.alloc_pct_at_100 for r in runs)
            m130 = statistics.fmean(r.alloc_pct_at_130 for r in runs)
            cells = [trace, policy, f"{m100:.2f}", f"{m130:.2f}"]
            if bounds:
                cells += [f"{b100:.2f}", f"{b130:.2f}", f"{b100 - m100:.2f}", f"{b130 - m130:.2f}"]
            if links:
                pods = sum(r.links.pods for r in runs)
                n = max(pods, 1)
                cells += [
                    str(pods),
                    f"{sum(r.links.score for r in runs) / n:.1f}",
                    f"{sum(r.links.relative for r in runs) / n:.3f}",
                    f"{100 * sum(r.links.nvlink for r in runs) / n:.1f}%",
                    f"{100 * sum(r.links.cross for r in runs) / n:.1f}%",
                ]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
