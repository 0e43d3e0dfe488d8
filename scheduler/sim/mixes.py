"""Trace mixes: openb pod lists with some pod classes subsampled or repeated, and GPU models asked for.

The four shared openb pod lists differ in one class each (more CPU-only pods, more multi-GPU pods, more
sharing pods). To test a policy on trace shapes it was not tuned on, ``reweight`` makes other mixes
from them: every pod is kept ``floor(w)`` times plus once more with probability ``w - floor(w)``,
where ``w`` is the product of the factors of the classes it belongs to (a factor of 1 leaves a class
as it is, 0.5 keeps about half of it, 3 repeats it three times). ``assign_specs`` first lets a share of
the GPU pods ask for one GPU model (openb's ``gpu_spec``; the shared lists leave it empty), as the
FGD paper's gpuspec traces do. Both are pure functions of their inputs and a seed; a ``Mix`` names a
recipe (source trace, spec share, factors, mix seed) so that a bench can rebuild it exactly.

    python -m scheduler.sim.mixes --nodes NODES.csv --pods PODS.csv --factor multi=3 --seed 1 --out m.csv
    python -m scheduler.sim.mixes --nodes NODES.csv --pods PODS.csv --spec-share 0.3 --factor spec=2 ...

Classes (a pod may be in two: ``spec`` with one of the others): ``cpu`` (no GPU), ``share`` (a share of
one GPU), ``single`` (one whole GPU), ``multi`` (two or more whole GPUs), ``whole`` (as many whole GPUs
as the largest node has, 8 on openb; also ``multi``), ``spec`` (asks for particular GPU models).
Copies are named ``NAME-rK`` (K = 1, 2, ...); the first keeps the pod's name. Pod groups (``gang``)
are not kept: a mix is a list of independent pods.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from scheduler.core.request import PodRequest
from scheduler.sim.trace import NodeSpec, load_nodes, load_pods

CLASSES = ("cpu", "share", "single", "multi", "whole", "spec")
MAX_FACTOR = 100.0


def pod_classes(pod: PodRequest, largest: int = 8) -> frozenset[str]:
    """The classes ``pod`` belongs to; ``largest``: the most GPUs any node has (whole-node pods)."""
    if pod.gpu_count == 0:
        out = {"cpu"}
    elif pod.is_share:
        out = {"share"}
    elif pod.gpu_count == 1:
        out = {"single"}
    else:
        out = {"multi", "whole"} if pod.gpu_count >= largest else {"multi"}
    if pod.gpu_models:
        out.add("spec")
    return frozenset(out)


def check_factors(factors: Mapping[str, float]) -> None:
    """``ValueError`` naming the entry for an unknown class or a factor outside 0..``MAX_FACTOR``."""
    for name, value in factors.items():
        if name not in CLASSES:
            raise ValueError(f"unknown pod class {name!r} (known: {', '.join(CLASSES)})")
        if not 0 <= value <= MAX_FACTOR:  # NaN fails too
            raise ValueError(f"factor of {name} must be in [0, {MAX_FACTOR:g}], not {value!r}")


def reweight(
    pods: Sequence[PodRequest], factors: Mapping[str, float], seed: int, largest: int = 8
) -> list[PodRequest]:
    """Each pod ``floor(w)`` times and once more with probability ``w - floor(w)``, ``w`` the product of
    its classes' factors (absent: 1); in trace order, copies right after their pod. ``ValueError`` for a
    bad factor or when nothing is left."""
    check_factors(factors)
    rng = random.Random(seed)
    out: list[PodRequest] = []
    for pod in pods:
        weight = math.prod(factors.get(c, 1.0) for c in sorted(pod_classes(pod, largest)))
        copies = int(weight)
        if rng.random() < weight - copies:
            copies += 1
        for k in range(copies):
            out.append(pod if k == 0 else replace(pod, name=f"{pod.name}-r{k}", uid=f"{pod.uid}-r{k}"))
    if not out:
        raise ValueError("the mix leaves no pod")
    return out


def assign_specs(
    pods: Sequence[PodRequest], nodes: Sequence[NodeSpec], share: float, seed: int
) -> list[PodRequest]:
    """The pods with ``share`` (0..1) of the GPU pods, drawn at random, asking for one GPU model: a model
    of the nodes with at least the pod's GPU count, drawn in proportion to those nodes' GPUs. Pods that
    already ask for models, and CPU-only pods, are left as they are."""
    if not 0 <= share <= 1:
        raise ValueError(f"spec share must be in [0, 1], not {share!r}")
    rng = random.Random(seed)
    by_count: dict[int, tuple[list[str], list[int]]] = {}
    out = []
    for pod in pods:
        if pod.gpu_count == 0 or pod.gpu_models or rng.random() >= share:
            out.append(pod)
            continue
        if pod.gpu_count not in by_count:
            gpus: Counter[str] = Counter()
            for node in nodes:
                if node.gpus >= pod.gpu_count and node.model:
                    gpus[node.model] += node.gpus
            models = sorted(gpus)
            by_count[pod.gpu_count] = (models, [gpus[m] for m in models])
        models, weights = by_count[pod.gpu_count]
        if not models:
            out.append(pod)
            continue
        out.append(replace(pod, gpu_models=frozenset(rng.choices(models, weights)[0:1])))
    return out


@dataclass(frozen=True)
class Mix:
    """A named recipe: ``trace`` (a pod list's variant name, e.g. ``default``), the share of GPU pods
    given a GPU model, the class factors and the seed of the draws; ``seeds`` the protocol seeds to run."""

    name: str
    trace: str
    factors: Mapping[str, float] = field(default_factory=dict)
    spec_share: float = 0.0
    mix_seed: int = 0
    seeds: tuple[int, ...] = ()

    def build(self, pods: Sequence[PodRequest], nodes: Sequence[NodeSpec]) -> list[PodRequest]:
        """The mix's pods from the trace's ``pods`` on ``nodes`` (specs first, then the factors)."""
        largest = max((n.gpus for n in nodes), default=0)
        specs = assign_specs(pods, nodes, self.spec_share, self.mix_seed) if self.spec_share else list(pods)
        return reweight(specs, self.factors, self.mix_seed, largest)


def load_mixes(path: str | Path) -> dict[str, list[Mix]]:
    """A mix file: ``{"SET": [{"name", "trace", "factors"?, "spec_share"?, "mix_seed"?, "seeds"}, ...]}``.
    ``ValueError`` naming the entry for a malformed one or a repeated name."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not an object of named sets")
    out: dict[str, list[Mix]] = {}
    names: set[str] = set()
    for set_name, entries in doc.items():
        if set_name.startswith("_"):
            continue  # comments
        if not isinstance(entries, list):
            raise ValueError(f"{path}: set {set_name!r} is not a list")
        mixes = []
        for entry in entries:
            try:
                mix = Mix(
                    name=str(entry["name"]),
                    trace=str(entry["trace"]),
                    factors={str(k): float(v) for k, v in entry.get("factors", {}).items()},
                    spec_share=float(entry.get("spec_share", 0.0)),
                    mix_seed=int(entry.get("mix_seed", 0)),
                    seeds=tuple(int(s) for s in entry["seeds"]),
                )
                check_factors(mix.factors)
                if not 0 <= mix.spec_share <= 1 or not mix.seeds:
                    raise ValueError("spec_share must be in [0, 1] and seeds not empty")
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                raise ValueError(f"{path}: set {set_name!r}: entry {entry!r}: {error}") from None
            if mix.name in names:
                raise ValueError(f"{path}: mix name {mix.name!r} given twice")
            names.add(mix.name)
            mixes.append(mix)
        out[set_name] = mixes
    return out


def class_counts(pods: Sequence[PodRequest], largest: int = 8) -> dict[str, int]:
    """How many pods of each class, and the share of the GPU demand of each (``CLASS_gpu_pct``)."""
    counts: Counter[str] = Counter()
    milli: Counter[str] = Counter()
    for pod in pods:
        for c in pod_classes(pod, largest):
            counts[c] += 1
            milli[c] += pod.total_gpu_milli
    total = sum(p.total_gpu_milli for p in pods) or 1
    out = {c: counts[c] for c in CLASSES}
    out.update({f"{c}_gpu_pct": round(100 * milli[c] / total, 1) for c in CLASSES if c != "cpu"})
    return out


def write_pods(pods: Sequence[PodRequest], path: str | Path) -> None:
    """The pods as an openb pod list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec``)."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
        for p in pods:
            milli = p.gpu_milli if p.gpu_count else 0
            models = "|".join(sorted(p.gpu_models))
            out.writerow([p.name, p.cpu_milli, p.memory_mib, p.gpu_count, milli, models])


def _factor(text: str) -> tuple[str, float]:
    name, eq, value = text.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(f"{text!r} is not CLASS=FACTOR")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Write a mix of a pod list (or print its class counts); exit 2 with one line for bad input."""
    parser = argparse.ArgumentParser(prog="python -m scheduler.sim.mixes", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", required=True, help="openb node list (GPU models, the largest node)")
    parser.add_argument("--pods", required=True, help="openb pod list")
    parser.add_argument("--factor", type=_factor, action="append", default=[], metavar="CLASS=FACTOR")
    parser.add_argument("--spec-share", type=float, default=0.0, help="share of GPU pods given a GPU model")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    parser.add_argument("--out", help="write the mix here (openb pod list); without it, only the counts")
    args = parser.parse_args(argv)
    mix = Mix("cli", Path(args.pods).stem, dict(args.factor), args.spec_share, args.seed)
    try:
        nodes = load_nodes(args.nodes)
        pods = mix.build(load_pods(args.pods), nodes)
        if args.out:
            write_pods(pods, args.out)
    except (OSError, ValueError) as error:
        print(f"mixes: {error}", file=sys.stderr)
        return 2
    largest = max(n.gpus for n in nodes)
    print(json.dumps({"pods": len(pods), **class_counts(pods, largest)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
