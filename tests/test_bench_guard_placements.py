"""``guard1ns-need1``'s placements (bench/placement_variants.py), pod by pod, must not change when its
code is only made faster, and the default ``fgd-reserve`` must place as it does.

``guard1ns-need1`` (``ModelGuard`` above FGD's bands, ``ModelNeed`` as the tie-break's model balance,
both bench/placement_variants.py's own classes over ``reserve-v2``) was ported into the default
(``scheduler.core.policies``: ``ModelGuard``, ``ModelNeed``) on 2026-11-29 with identical decisions:
the default's placements must be the variant's recorded ones. Each case runs the simulator's protocol
(``run_once``) on one node in four and one pod in four of a shared openb trace, mixed as the tuning
mixes of bench/openb_mixes.json are (GPU-spec-heavy ones, where the guard and the balance act, and the
plain ``default`` trace, where neither applies), and reduces every pod's node and GPUs to a digest
(``tests/test_sim_default_placements.py``'s ``digest``) kept in ``tests/data/guard_placements.json``
with the old default's (``reserve-v2``, the default before the port) on the same cases: on the GPU-spec
mixes the two must differ (the guard and the balance decided something there, so the cases check their
code). Skipped without the openb traces.

A change that is meant to move decisions rewrites the digests, and says so in its commit:

    PYTHONPATH=. .venv/bin/python tests/test_bench_guard_placements.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from scheduler.core import policies as core_policies  # noqa: E402
from scheduler.core.request import PodRequest  # noqa: E402
from scheduler.sim.mixes import Mix  # noqa: E402
from scheduler.sim.trace import NodeSpec, load_nodes, load_pods  # noqa: E402
from tests.support.benchscript import bench_module  # noqa: E402
from tests.test_sim_default_placements import OPENB, SAMPLE, digest  # noqa: E402

variants = bench_module("placement_variants.py", "placement_variants_guard_placements")

GOLDEN = ROOT / "tests" / "data" / "guard_placements.json"
VARIANT = "guard1ns-need1"
OLD = "reserve-v2"  # the default before the port (bench/placement_variants.py)
# the tuning mixes' recipes (bench/openb_mixes.json), on the sampled trace
MIXES: dict[str, Mix] = {
    "t-spec30-cpu050": Mix("t-spec30-cpu050", "cpu050", spec_share=0.3, mix_seed=1),
    "t-spec30-gs40": Mix("t-spec30-gs40", "gpushare40", spec_share=0.3, mix_seed=1),
    "t-spec40-mg20": Mix("t-spec40-mg20", "multigpu20", spec_share=0.4, mix_seed=1),
    "t-spec30-cpu2-gs40": Mix("t-spec30-cpu2-gs40", "gpushare40", {"cpu": 2}, 0.3, mix_seed=1),
    "default": Mix("default", "default"),
}
SPEC = [name for name, mix in MIXES.items() if mix.spec_share]
CASES = [(name, seed) for name in MIXES for seed in (42, 43)]


def case_id(policy: str, name: str, seed: int) -> str:
    return f"{policy}/{name}/{seed}"


_LOADED: dict[str, tuple[list[NodeSpec], list[PodRequest]] | None] = {}


def workload(name: str) -> tuple[list[NodeSpec], list[PodRequest]] | None:
    """The sampled nodes and the mixed sampled pods of a case; None without the openb traces."""
    if name not in _LOADED:
        mix = MIXES[name]
        pod_list = OPENB / f"openb_pod_list_{mix.trace}.csv"
        if not pod_list.is_file():
            _LOADED[name] = None
        else:
            nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")[::SAMPLE]
            _LOADED[name] = (nodes, mix.build(load_pods(pod_list)[::SAMPLE], nodes))
    return _LOADED[name]


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variant and the old default as policy names, for this test only."""
    for name in (VARIANT, OLD):
        monkeypatch.setitem(core_policies.POLICIES, name, variants.VARIANTS[name])


@pytest.mark.parametrize(("name", "seed"), CASES, ids=[f"{n}/{s}" for n, s in CASES])
def test_guard1ns_need1_placements_are_unchanged(registered: None, name: str, seed: int) -> None:
    loaded = workload(name)
    if loaded is None:
        pytest.skip(f"the openb traces are not at {OPENB}")
    expected = json.loads(GOLDEN.read_text())[case_id(VARIANT, name, seed)]
    assert digest(VARIANT, *loaded, seed, "node-order") == expected


@pytest.mark.parametrize(("name", "seed"), CASES, ids=[f"{n}/{s}" for n, s in CASES])
def test_the_default_places_as_guard1ns_need1(monkeypatch: pytest.MonkeyPatch, name: str, seed: int) -> None:
    """The port: the default (scheduler/core's ``ModelGuard`` and ``ModelNeed``) makes the variant's
    decisions (bench/placement_variants.py's own classes), pod by pod; with the alignment exact while CPU
    binds whatever arrived, as when ported (``restricted_banded``, the default's since the same day, moves
    the CPU-bound cases: tests/test_sim_default_placements.py holds the default's own digests)."""
    loaded = workload(name)
    if loaded is None:
        pytest.skip(f"the openb traces are not at {OPENB}")
    monkeypatch.setitem(
        core_policies.POLICIES, "ported", lambda: core_policies.fgd_reserve(restricted_banded=False)
    )
    expected = json.loads(GOLDEN.read_text())[case_id(VARIANT, name, seed)]
    assert digest("ported", *loaded, seed, "node-order") == expected


@pytest.mark.parametrize(("name", "seed"), [c for c in CASES if c[0] in SPEC][:2])
def test_the_old_default_stays_reachable(registered: None, name: str, seed: int) -> None:
    """``reserve-v2`` places as the default did before the port (recorded then)."""
    loaded = workload(name)
    if loaded is None:
        pytest.skip(f"the openb traces are not at {OPENB}")
    expected = json.loads(GOLDEN.read_text())[case_id(OLD, name, seed)]
    assert digest(OLD, *loaded, seed, "node-order") == expected


def test_the_cases_exercise_the_guard_and_the_balance() -> None:
    """On the GPU-spec mixes the variant places otherwise than the old default (recorded digests); on
    the trace without restricted pods exactly as it (neither part applies)."""
    golden = json.loads(GOLDEN.read_text())
    for name, seed in CASES:
        ours, old = golden[case_id(VARIANT, name, seed)], golden[case_id(OLD, name, seed)]
        assert (ours != old) == (name in SPEC), (name, seed)


def write() -> None:
    """Record the digests of every case, the variant's and the old default's (the traces must be
    present)."""
    for name in (VARIANT, OLD):
        core_policies.POLICIES[name] = variants.VARIANTS[name]
    out: dict[str, str] = {}
    for name, seed in CASES:
        loaded = workload(name)
        if loaded is None:
            raise SystemExit(f"the openb traces are not at {OPENB}")
        for policy in (VARIANT, OLD):
            out[case_id(policy, name, seed)] = digest(policy, *loaded, seed, "node-order")
            print(case_id(policy, name, seed), out[case_id(policy, name, seed)], flush=True)
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(f"usage: {sys.argv[0]} --write")
    write()
