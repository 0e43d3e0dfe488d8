"""The default policy's placements, pod by pod, must not change when its code is only made faster.

Issue 26 asks for a cheaper ``fgd-reserve`` with identical decisions. Each case runs the simulator's
protocol (``run_once``) on a small workload and reduces the final cluster, every pod's node and GPUs
(index and milli), to a digest kept in ``tests/data/default_placements.json``. The protocol never
releases a pod, so the final cluster holds every placement of the run. The cases: the bundled
sample (``scheduler/data``) and its mixes (multi-GPU, whole-node, GPU-spec and CPU heavy, with the
model balance, the whole-node reserve, the exact alignment, FGD's fine bands and the share remainders at
work), and
one node in four and one pod in four of the shared openb traces (skipped without them), on several
seeds; ``fgd``, ``fgd-align`` and the live scheduler's ``topology`` share the code and are checked
on some of them.

A change that is meant to move decisions rewrites the digests, and says so in its commit:

    PYTHONPATH=. .venv/bin/python tests/test_sim_default_placements.py --write
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from scheduler.core.policies import POLICIES, fgd_reserve  # noqa: E402
from scheduler.core.request import PodRequest  # noqa: E402
from scheduler.core.state import ClusterState  # noqa: E402
from scheduler.sim.mixes import Mix  # noqa: E402
from scheduler.sim.protocol import run_once  # noqa: E402
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, NodeSpec, load_nodes, load_pods  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "default_placements.json"
# ../shared beside the checkout, or OPENB_TRACES (as bench/simulate_openb.py)
OPENB = Path(os.environ.get("OPENB_TRACES") or ROOT.parent / "shared" / "traces" / "openb")
SAMPLE = 4  # the openb cases take every SAMPLE-th node and pod

# name -> (source: "sample" or an openb pod list, recipe); the recipes of bench/openb_mixes.json's kinds
MIXES: dict[str, tuple[str, Mix]] = {
    "sample": ("sample", Mix("sample", "sample")),
    "sample-multi3": ("sample", Mix("sample-multi3", "sample", {"multi": 3}, mix_seed=1)),
    "sample-whole4": ("sample", Mix("sample-whole4", "sample", {"whole": 4}, mix_seed=2)),
    "sample-spec50": ("sample", Mix("sample-spec50", "sample", spec_share=0.5, mix_seed=2)),
    "sample-cpu3": ("sample", Mix("sample-cpu3", "sample", {"cpu": 3}, mix_seed=1)),
    "sample-share3": ("sample", Mix("sample-share3", "sample", {"share": 3}, mix_seed=2)),
    "openb-default": ("default", Mix("openb-default", "default")),
    "openb-gpushare40": ("gpushare40", Mix("openb-gpushare40", "gpushare40")),
    "openb-multi3-mg20": ("multigpu20", Mix("openb-multi3-mg20", "multigpu20", {"multi": 3}, mix_seed=1)),
    "openb-whole4": ("default", Mix("openb-whole4", "default", {"whole": 4}, mix_seed=2)),
    "openb-spec30": ("default", Mix("openb-spec30", "default", spec_share=0.3, mix_seed=1)),
    "openb-spec50-mg20": ("multigpu20", Mix("openb-spec50-mg20", "multigpu20", spec_share=0.5, mix_seed=2)),
    "openb-cpu3": ("default", Mix("openb-cpu3", "default", {"cpu": 3}, mix_seed=1)),
    "openb-mixed": ("default", Mix("openb-mixed", "default", {"multi": 2, "share": 2}, 0.2, mix_seed=2)),
    # CPU binds, pods name models: the alignment banded from the first restricted pod to 0.7 of the capacity
    "openb-spec25-cpu3-mg20": (
        "multigpu20",
        Mix("openb-spec25-cpu3-mg20", "multigpu20", {"cpu": 3}, 0.25, mix_seed=1),
    ),
    # CPU runs out far ahead of GPUs: FGD in bands of 1 until 0.7 of the CPU was asked (FineBands)
    "sample-cpu5": ("sample", Mix("sample-cpu5", "sample", {"cpu": 5}, mix_seed=1)),
    "openb-cpu4-gs40": ("gpushare40", Mix("openb-cpu4-gs40", "gpushare40", {"cpu": 4}, mix_seed=1)),
}
SEEDS = {"sample": (42, 43, 44), "openb": (42, 43)}  # the openb cases take longer (0.5-1 s each)
# (policy, workload, seed, ties): the default everywhere; the policies sharing its code on some
CASES = [("fgd-reserve", name, seed, "node-order") for name in MIXES for seed in SEEDS[name.split("-")[0]]]
CASES += [("fgd-reserve", name, 42, "random") for name in ("sample-whole4", "openb-default")]
CASES += [("fgd", name, 42, "node-order") for name in ("sample-spec50", "openb-default", "openb-spec30")]
CASES += [("fgd-align", name, 42, "node-order") for name in ("sample-cpu3", "openb-cpu3")]
CASES += [("topology", name, 42, "random") for name in ("sample-multi3", "openb-multi3-mg20", "openb-mixed")]
# the CPU-heaviest sample case, where fgd-reserve's fine bands act: topology keeps FGD's own bands (its
# digest is that of before the gate, commit ce933dc)
CASES += [("topology", "sample-cpu5", 42, "random")]


def case_id(policy: str, workload: str, seed: int, ties: str) -> str:
    return f"{policy}/{workload}/{seed}/{ties}"


def workload(name: str) -> tuple[list[NodeSpec], list[PodRequest]] | None:
    """The nodes and pods of a case's workload; None when its openb trace is not on this machine."""
    source, mix = MIXES[name]
    if source == "sample":
        nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    else:
        if not (OPENB / f"openb_pod_list_{source}.csv").is_file():
            return None
        nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")[::SAMPLE]
        pods = load_pods(OPENB / f"openb_pod_list_{source}.csv")[::SAMPLE]
    return nodes, mix.build(pods, nodes)


def placements(cluster: ClusterState) -> list[tuple[str, str, tuple[tuple[int, int], ...]]]:
    """Every pod's (uid, node, ((GPU index, milli), ...)), by uid."""
    return sorted(
        (uid, node.name, tuple((g.index, g.milli) for g in alloc.gpus))
        for node in cluster.nodes
        for uid, alloc in node.allocations.items()
    )


def digest(policy: str, nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], seed: int, ties: str) -> str:
    """The placements of one protocol run, as ``PODS:SHA256`` (the count of placed pods first)."""
    got: list[tuple[str, str, tuple[tuple[int, int], ...]]] = []
    run_once(nodes, pods, policy, seed, ties=ties, observe=lambda cluster: got.extend(placements(cluster)))
    return f"{len(got)}:{hashlib.sha256(json.dumps(got).encode()).hexdigest()}"


_LOADED: dict[str, tuple[list[NodeSpec], list[PodRequest]] | None] = {}


def loaded_or_skip(name: str) -> tuple[list[NodeSpec], list[PodRequest]]:
    """A case's workload, loaded once per session; the test skips when its openb trace is absent."""
    if name not in _LOADED:
        _LOADED[name] = workload(name)
    loaded = _LOADED[name]
    if loaded is None:
        pytest.skip(f"the openb traces are not at {OPENB}")
    return loaded


@pytest.mark.parametrize(("policy", "name", "seed", "ties"), CASES, ids=[case_id(*c) for c in CASES])
def test_placements_are_unchanged(policy: str, name: str, seed: int, ties: str) -> None:
    loaded = loaded_or_skip(name)
    expected = json.loads(GOLDEN.read_text())[case_id(policy, name, seed, ties)]
    assert digest(policy, *loaded, seed, ties) == expected


def test_the_cpu_bound_spec_case_exercises_the_banded_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    """On openb-spec25-cpu3-mg20 (seed 42) the default's recorded placements differ from those with the
    alignment banded for the rest of the run once a restricted pod arrived (``banded_until=None``) and
    from those never banded (``restricted_banded=False``): the case checks both parts of the rule."""
    name = "openb-spec25-cpu3-mg20"
    loaded = loaded_or_skip(name)
    recorded = json.loads(GOLDEN.read_text())[case_id("fgd-reserve", name, 42, "node-order")]
    for parts in ({"banded_until": None}, {"restricted_banded": False}):
        monkeypatch.setitem(POLICIES, "variant", lambda parts=parts: fgd_reserve(**parts))
        assert digest("variant", *loaded, 42, "node-order") != recorded, parts


@pytest.mark.parametrize("name", ["sample-cpu3", "sample-cpu5", "openb-cpu4-gs40"])
def test_the_cpu_heaviest_cases_exercise_the_fine_bands(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On these cases (seed 42) the default's recorded placements differ from those with FGD in its own
    bands throughout (``fine=None``): the cases check the fine bands' gate, which acts on them."""
    loaded = loaded_or_skip(name)
    recorded = json.loads(GOLDEN.read_text())[case_id("fgd-reserve", name, 42, "node-order")]
    monkeypatch.setitem(POLICIES, "variant", lambda: fgd_reserve(fine=None))
    assert digest("variant", *loaded, 42, "node-order") != recorded


def write() -> None:
    """Record the digests of every case (the openb traces must be present)."""
    out: dict[str, str] = {}
    for policy, name, seed, ties in CASES:
        loaded = workload(name)
        if loaded is None:
            raise SystemExit(f"the openb traces are not at {OPENB}")
        out[case_id(policy, name, seed, ties)] = digest(policy, *loaded, seed, ties)
        print(case_id(policy, name, seed, ties), out[case_id(policy, name, seed, ties)], flush=True)
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(f"usage: {sys.argv[0]} --write")
    write()
