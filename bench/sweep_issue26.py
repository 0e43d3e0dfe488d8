"""Issue 26's full sweep, for a many-core machine: every mix of bench/openb_mixes.json (tuning on seeds
42.., held-out on seeds 1..) and the four shared openb traces, with fgd, fgd-align and fgd-reserve,
one process per core; JSON (every run's points at 100% and 130% and its whole curve) to --out, and
per mix the margins to FGD on stdout. Stdlib + numpy + this repository's simulator only.

    OPENB_TRACES=/path/to/openb python3 bench/sweep_issue26.py --jobs 16 --seeds 10 --out $OUT/issue26.json

``--seeds N``: protocol seeds per mix and trace (tuning mixes and traces 42..42+N-1, held-out 1..N,
the later held-out sets from their mixes' first seed on: heldout2 11.., heldout3 21..);
``--sets tuning,heldout,...``: which sets of the mix file (default tuning,heldout; the shared traces are
always run); ``--only NAME,...`` restricts to those mixes/traces (a test here runs one mix on one seed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import simulate_openb as openb  # noqa: E402

from scheduler.sim.mixes import load_mixes  # noqa: E402
from scheduler.sim.protocol import run_once  # noqa: E402

TRACES = openb.TRACES  # the shared traces and the mixes, where simulate_openb reads them (OPENB_TRACES)
MIXES = openb.MIXES
POLICIES = ("fgd", "fgd-align", "fgd-reserve")
workload = openb.load_workload  # (nodes, pods) of a shared trace or a mix, loaded once per process


def job(name: str, policy: str, seed: int, ties: str = "node-order") -> dict:
    nodes, pods = workload(name)
    run = run_once(nodes, pods, policy, seed, ties=ties)
    return {
        "name": name,
        "policy": policy,
        "seed": seed,
        "at_100": run.alloc_pct_at_100,
        "at_130": run.alloc_pct_at_130,
        "seconds": run.seconds,
        "curve": {str(k): v for k, v in run.curve.items()},
    }


def curve_of(run: dict) -> Callable[[int], float]:
    """A run's allocated % at an arrived %, from its JSON curve (keys are strings)."""
    curve = run["curve"]
    return lambda x: curve[str(x)]


def summary(runs: list[dict]) -> dict[str, dict]:
    """Per workload and policy but fgd: mean @100/@130, min paired margin, the mean curve's worst point."""
    out: dict[str, dict] = {}
    by: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        by.setdefault((r["name"], r["policy"]), []).append(r)
    for (name, policy), rs in sorted(by.items()):
        rs.sort(key=lambda r: r["seed"])
        entry = {
            "at_100": statistics.fmean(r["at_100"] for r in rs),
            "at_130": statistics.fmean(r["at_130"] for r in rs),
        }
        fgd = sorted(by.get((name, "fgd"), []), key=lambda r: r["seed"])
        if policy != "fgd" and len(fgd) == len(rs):
            entry["min_margin_100"] = min(a["at_100"] - b["at_100"] for a, b in zip(rs, fgd, strict=True))
            entry["min_margin_130"] = min(a["at_130"] - b["at_130"] for a, b in zip(rs, fgd, strict=True))
            worst, margin, below = openb.curve_margin([curve_of(r) for r in rs], [curve_of(r) for r in fgd])
            entry["curve_min_margin"] = [worst, margin]
            entry["curve_points_below"] = below
        out[f"{name}/{policy}"] = entry
    return out


FIRST_SEED = {"tuning": 42, "heldout": 1}  # the sets' seeds from before the mixes carried their own


def mix_work(sets: dict, chosen: list[str], seeds: int, only: set[str]) -> list[tuple[str, str, int]]:
    """(mix, policy, seed) for every mix of the ``chosen`` sets (all of ``only`` if given): ``seeds``
    protocol seeds from ``FIRST_SEED`` of the set, else from the mix's own first seed."""
    work: list[tuple[str, str, int]] = []
    for set_name in chosen:
        if set_name not in sets:
            raise SystemExit(f"no set {set_name!r} in {MIXES} (there are: {', '.join(sorted(sets))})")
        for mix in sets[set_name]:
            if not only or mix.name in only:
                first = FIRST_SEED.get(set_name, mix.seeds[0])
                work += [(mix.name, p, s) for p in POLICIES for s in range(first, first + seeds)]
    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sets", default="tuning,heldout")
    parser.add_argument("--only", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    sets = load_mixes(MIXES)
    only = {n for n in args.only.split(",") if n}
    work = mix_work(sets, [n for n in args.sets.split(",") if n], args.seeds, only)
    for trace in TRACES:
        if not only or trace in only:
            work += [(trace, p, s) for p in ("fgd", "fgd-reserve") for s in range(42, 42 + args.seeds)]
    start = time.perf_counter()
    with ProcessPoolExecutor(max(args.jobs, 1)) as pool:
        runs = list(pool.map(job, *zip(*work, strict=True), chunksize=1))
    doc = {"runs": runs, "summary": summary(runs), "seconds": time.perf_counter() - start, "jobs": args.jobs}
    Path(args.out).write_text(json.dumps(doc))
    for key, entry in doc["summary"].items():
        print(key, json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in entry.items()}))
    print(f"{len(runs)} runs in {doc['seconds']:.0f} s with {args.jobs} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
