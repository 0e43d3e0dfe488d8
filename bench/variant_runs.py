"""Issue 26's variant runs on any seeds: (workload, policy, seed) runs of the simulator, kept in a JSON-lines
cache so a later call runs only what is new, and per workload and policy the margins to FGD as a markdown
table. The mixes' own seeds do not apply here: every workload runs on ``--seeds``.

    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/variant_runs.py \\
        --names tuning,shared --seeds 42-51 --policies fgd,fgd-reserve=default,fgd8 [--cache FILE]

``--names``: mixes, traces, or a set of the mix file (``tuning``, ``heldout``, ...) or ``shared`` (the
four traces); ``--policies``: names of bench/simulate_openb.py's policies or bench/placement_variants.py's
variants, each ``NAME`` or ``NAME=LABEL`` (the label keys the cache: give a new one when the code behind a
name changed); ``--ties random``: ties broken at random as the live scheduler breaks them (the labels get
``@random``, so one cache holds both); ``--mix-file``: the mixes of another file (bench/probe26_mixes.json).
Columns: means at 100% and 130% arrived, the mean and smallest difference to the reference at 130% paired
by seed, how many seeds are at or below it at 100% / 130%, the mean curve's smallest difference over
10..130% (where) and how many of those points are below it by more than 0.005.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import placement_variants as variants  # noqa: E402
import simulate_openb as openb  # noqa: E402
import sweep_issue26 as sweep  # noqa: E402

from scheduler.core import policies as core_policies  # noqa: E402
from scheduler.sim.mixes import load_mixes  # noqa: E402
from scheduler.sim.runner import parse_seeds  # noqa: E402


def register_variants() -> None:
    """Make bench/placement_variants.py's names policies (in this process: not at import, which would
    change the core's registry for whoever imports this module)."""
    core_policies.POLICIES.update(variants.VARIANTS)
    openb.POLICIES.update(variants.VARIANTS)


def job(name: str, policy: str, seed: int, label: str, ties: str = "node-order", mixes: str = "") -> dict:
    """One run, as a cache line (bench/sweep_issue26.py's, keyed by ``label``), ties broken as ``ties``
    says (``run_once``), the mixes read from ``mixes`` (a mix file; empty: bench/openb_mixes.json)."""
    register_variants()
    if mixes:
        openb.MIXES = Path(mixes)
    return {**sweep.job(name, policy, seed, ties), "policy": label}


def labelled(policies: str, ties: str) -> list[tuple[str, str]]:
    """``--policies`` as (policy, cache label) pairs: ``NAME`` or ``NAME=LABEL``; with ties other than
    the node order the label gets ``@TIES`` (runs of one policy under both keep apart in one cache)."""
    suffix = "" if ties == "node-order" else f"@{ties}"
    return [(p.split("=")[0], p.split("=")[-1] + suffix) for p in policies.split(",") if p]


def load_cache(path: Path) -> dict[tuple[str, str, int], dict]:
    """The cached runs by (workload, label, seed); a missing file is an empty cache."""
    out: dict[tuple[str, str, int], dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                run = json.loads(line)
                out[(run["name"], run["policy"], run["seed"])] = run
    return out


def row(runs: list[dict], ref: list[dict]) -> dict:
    """Per workload and policy, against the reference's runs of the same seeds (both in seed order)."""
    at_100 = [r["at_100"] - f["at_100"] for r, f in zip(runs, ref, strict=True)]
    at_130 = [r["at_130"] - f["at_130"] for r, f in zip(runs, ref, strict=True)]
    curves, ref_curves = [sweep.curve_of(r) for r in runs], [sweep.curve_of(f) for f in ref]
    worst, margin, below = openb.curve_margin(curves, ref_curves)
    return {
        "at_100": statistics.fmean(r["at_100"] for r in runs),
        "at_130": statistics.fmean(r["at_130"] for r in runs),
        "margin_130": statistics.fmean(at_130),
        "min_margin_130": min(at_130),
        "seeds_at_or_below": (sum(d <= 0 for d in at_100), sum(d <= 0 for d in at_130)),
        "curve_worst": (worst, margin),
        "curve_points_below": below,
    }


def names_of(text: str) -> list[str]:
    """The workloads ``--names`` stands for (sets of the mix file and ``shared`` expanded)."""
    sets = load_mixes(openb.MIXES)
    out: list[str] = []
    for name in (n for n in text.split(",") if n):
        if name in sets:
            out += [mix.name for mix in sets[name]]
        elif name == "shared":
            out += list(openb.TRACES)
        else:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--names", required=True)
    parser.add_argument("--policies", required=True)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--ref", default="fgd")
    parser.add_argument("--cache", default="build/variant_runs.jsonl")
    parser.add_argument(
        "--mix-file", default="", help="mixes from this file (default bench/openb_mixes.json)"
    )
    parser.add_argument(
        "--ties", default="node-order", choices=("node-order", "random"), help="as the live scheduler: random"
    )
    args = parser.parse_args(argv)
    register_variants()
    if args.mix_file:
        openb.MIXES = Path(args.mix_file)
    names = names_of(args.names)
    seeds = parse_seeds(args.seeds)
    policies = labelled(args.policies, args.ties)
    ref_label = labelled(args.ref, args.ties)[0][1]
    cache_path = Path(args.cache)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache = load_cache(cache_path)
    work = [
        (n, p, s, label, args.ties, args.mix_file)
        for n in names
        for p, label in policies
        for s in seeds
        if (n, label, s) not in cache
    ]
    if work:
        with ProcessPoolExecutor(max(args.jobs, 1)) as pool, cache_path.open("a") as out:
            for run in pool.map(job, *zip(*work, strict=True), chunksize=1):
                out.write(json.dumps(run) + "\n")
                cache[(run["name"], run["policy"], run["seed"])] = run
    print(
        "| workload | policy | @100 | @130 | minus ref @130 mean (min) | seeds <= ref @100/@130 "
        "| curve worst (at) | below |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        known = all((name, ref_label, s) in cache for s in seeds)
        ref = [cache[(name, ref_label, s)] for s in seeds] if known else None
        for _, label in policies:
            runs = [cache[(name, label, s)] for s in seeds]
            if ref is None or label == ref_label:
                mean_100 = statistics.fmean(r["at_100"] for r in runs)
                mean_130 = statistics.fmean(r["at_130"] for r in runs)
                print(f"| {name} | {label} | {mean_100:.2f} | {mean_130:.2f} | | | | |")
                continue
            r = row(runs, ref)
            (at, margin), (n100, n130) = r["curve_worst"], r["seeds_at_or_below"]
            below = r["curve_points_below"]
            print(
                f"| {name} | {label} | {r['at_100']:.2f} | {r['at_130']:.2f} | {r['margin_130']:+.2f} "
                f"({r['min_margin_130']:+.2f}) | {n100}/{n130} | {margin:+.2f} ({at}) | {below} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
