"""Issue 26's headroom above FGD: per mix (or shared trace) and seed, the LP upper bound on the allocation
at 130% arrived (``scheduler.sim.bound.protocol_bounds``) beside FGD's and the other policies' runs, and
whether +TARGET points over FGD there is provably out of reach (the bound below FGD + TARGET).

    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/bound_headroom.py \\
        --names tuning --seeds 42-51 [--policies fgd,fgd-reserve] [--target 0.5] [--cache FILE]
    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/bound_headroom.py --names heldout,heldout2

``--names``: mixes, traces, or a set of the mix file (``tuning``, ``heldout``, ...) or ``shared`` (as
bench/variant_runs.py). Without ``--seeds`` every mix runs on its own seeds (bench/openb_mixes.json)
and a shared trace on 42-51. Bounds and runs are kept in a JSON-lines cache (``--cache``), so a later
call computes only what is new. The first policy is the reference (FGD). Per workload: the mean bound
and allocations at 130%, the headroom (bound minus the reference), each other policy's gap to the
bound and its share of the headroom, the share TARGET is of the headroom, on how many seeds the bound
is below the reference + TARGET (there no policy can be TARGET above it), whether it is so in the mean
over the seeds, and the headroom at 100% arrived (where the bound is tighter: no surplus). The bound
is also checked against every run at 100% and 130%: a run above it (by more than the runs' 0.01
rounding) is a defect of the bound, listed and the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import simulate_openb as openb  # noqa: E402
import sweep_issue26 as sweep  # noqa: E402
import variant_runs  # noqa: E402

from scheduler.sim.mixes import load_mixes  # noqa: E402
from scheduler.sim.runner import parse_seeds  # noqa: E402

BOUND = "bound"  # the cache's policy label of a bound line
SLACK = 0.01  # the runs' curve values are rounded to 0.01: a run this far above the bound is not a defect
SHARED_SEEDS = tuple(range(42, 52))


def bound_job(name: str, seed: int) -> dict:
    """The bound of one workload and seed at 100% and 130% arrived, as a cache line."""
    from scheduler.sim.bound import protocol_bounds

    nodes, pods = openb.load_workload(name)
    points = protocol_bounds(nodes, pods, seed, 1.3)
    return {
        "name": name,
        "policy": BOUND,
        "seed": seed,
        "at_100": points[100].bound_pct,
        "at_130": points[130].bound_pct,
        "converged": all(b.converged for b in points.values()),
        "seconds": sum(b.seconds for b in points.values()),
    }


def run_job(name: str, policy: str, seed: int) -> dict:
    """One policy run, as a cache line (its points at 100% and 130%, no curve)."""
    run = sweep.job(name, policy, seed)
    return {k: run[k] for k in ("name", "policy", "seed", "at_100", "at_130", "seconds")}


def _job(name: str, policy: str, seed: int) -> dict:
    return bound_job(name, seed) if policy == BOUND else run_job(name, policy, seed)


def seeds_of(names: Sequence[str], seeds: Sequence[int] | None) -> dict[str, list[int]]:
    """Each workload's seeds: ``seeds`` if given, else a mix's own and a shared trace's 42-51."""
    own = {m.name: list(m.seeds) for ms in load_mixes(openb.MIXES).values() for m in ms}
    out: dict[str, list[int]] = {}
    for name in names:
        if seeds is not None:
            out[name] = list(seeds)
        elif name in openb.TRACES:
            out[name] = list(SHARED_SEEDS)
        elif name in own:
            out[name] = own[name]
        else:
            raise SystemExit(f"bound_headroom: no mix or trace {name!r}")
    return out


def headroom(bounds: Sequence[dict], runs: dict[str, Sequence[dict]], ref: str, target: float) -> dict:
    """One workload: ``bounds`` and each policy's ``runs`` (all in the same seed order); ``ref`` is the
    policy the headroom is measured from. Per seed the bound must be at or above every run (at 100% and
    130%, up to ``SLACK``); ``violations`` lists (policy, seed, point, run, bound) where it is not."""
    seeds = [b["seed"] for b in bounds]
    for policy, rs in runs.items():
        if [r["seed"] for r in rs] != seeds:
            raise ValueError(f"{policy}: seeds {[r['seed'] for r in rs]} against the bound's {seeds}")
    b130 = [b["at_130"] for b in bounds]
    r130 = [r["at_130"] for r in runs[ref]]
    room = [b - f for b, f in zip(b130, r130, strict=True)]
    out = {
        "seeds": seeds,
        "bound_130": statistics.fmean(b130),
        "mean_130": {p: statistics.fmean(r["at_130"] for r in rs) for p, rs in runs.items()},
        "headroom": statistics.fmean(room),
        "min_headroom": min(room),
        "seeds_out_of_reach": sum(h < target for h in room),
        "out_of_reach_in_mean": statistics.fmean(room) < target,
        "violations": [
            (p, r["seed"], point, r[point], b[point])
            for p, rs in runs.items()
            for r, b in zip(rs, bounds, strict=True)
            for point in ("at_100", "at_130")
            if r[point] > b[point] + SLACK
        ],
    }
    out["gap"] = {p: out["bound_130"] - m for p, m in out["mean_130"].items()}
    out["headroom_100"] = statistics.fmean(b["at_100"] for b in bounds) - statistics.fmean(
        r["at_100"] for r in runs[ref]
    )
    out["target_share"] = target / out["headroom"] if out["headroom"] > 0 else float("inf")
    out["share"] = {
        p: (m - out["mean_130"][ref]) / out["headroom"] if out["headroom"] > 0 else float("nan")
        for p, m in out["mean_130"].items()
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--names", required=True)
    parser.add_argument("--policies", default="fgd,fgd-reserve")
    parser.add_argument("--seeds", default=None, help="every workload on these (default: its own)")
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cache", default="build/bound_headroom.jsonl")
    args = parser.parse_args(argv)
    names = variant_runs.names_of(args.names)
    seeds = seeds_of(names, parse_seeds(args.seeds) if args.seeds else None)
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in openb.POLICIES]
    if unknown or not policies:
        print(f"bound_headroom: unknown policies: {', '.join(unknown) or 'none given'}", file=sys.stderr)
        return 2
    cache_path = Path(args.cache)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache = variant_runs.load_cache(cache_path)
    work = [(n, p, s) for n in names for p in (BOUND, *policies) for s in seeds[n] if (n, p, s) not in cache]
    if work:
        with ProcessPoolExecutor(max(args.jobs, 1)) as pool, cache_path.open("a") as out:
            for line in pool.map(_job, *zip(*work, strict=True), chunksize=1):
                out.write(json.dumps(line) + "\n")
                out.flush()
                cache[(line["name"], line["policy"], line["seed"])] = line
    ref, others = policies[0], policies[1:]
    head = ["workload", "seeds", "bound @130", *(f"{p} @130" for p in policies), f"bound - {ref} mean (min)"]
    head += [f"bound - {p}" for p in others] + [f"{p} share of headroom" for p in others]
    head += [f"share of headroom +{args.target:g} needs", f"seeds bound < {ref} + {args.target:g}"]
    head += ["in the mean", f"bound - {ref} @100"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    violations = []
    for name in names:
        bounds = [cache[(name, BOUND, s)] for s in seeds[name]]
        h = headroom(
            bounds, {p: [cache[(name, p, s)] for s in seeds[name]] for p in policies}, ref, args.target
        )
        violations += [(name, *v) for v in h["violations"]]
        span = f"{h['seeds'][0]}-{h['seeds'][-1]}" if len(h["seeds"]) > 1 else str(h["seeds"][0])
        cells = [name, span, f"{h['bound_130']:.2f}", *(f"{h['mean_130'][p]:.2f}" for p in policies)]
        cells.append(f"{h['headroom']:.2f} ({h['min_headroom']:.2f})")
        cells += [f"{h['gap'][p]:.2f}" for p in others] + [f"{h['share'][p]:.0%}" for p in others]
        cells += [
            f"{h['target_share']:.0%}",
            f"{h['seeds_out_of_reach']}/{len(h['seeds'])}",
            "yes" if h["out_of_reach_in_mean"] else "no",
            f"{h['headroom_100']:.2f}",
        ]
        print("| " + " | ".join(cells) + " |", flush=True)
    unconverged = sorted(
        {(n, s) for (n, p, s), line in cache.items() if p == BOUND and not line["converged"]}
    )
    if unconverged:
        print(f"\nbounds stopped before the LP optimum (still bounds): {unconverged}")
    for name, policy, seed, point, value, bound in violations:
        print(f"UNSOUND: {name} {policy} seed {seed} {point}: run {value:.2f} above the bound {bound:.2f}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
