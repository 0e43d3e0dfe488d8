"""Trace mixes (scheduler/sim/mixes.py): classes, reweighting, GPU models asked for, the mix file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from scheduler.core.request import PodRequest
from scheduler.sim import mixes
from scheduler.sim.mixes import Mix, assign_specs, load_mixes, pod_classes, reweight, write_pods
from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, NodeSpec, load_nodes, load_pods

ROOT = Path(__file__).resolve().parent.parent


def pods() -> list[PodRequest]:
    return [
        PodRequest("cpu", cpu_milli=4000),
        PodRequest("share", cpu_milli=4000, gpu_count=1, gpu_milli=500),
        PodRequest("one", cpu_milli=8000, gpu_count=1, gpu_milli=1000),
        PodRequest("two", cpu_milli=16000, gpu_count=2, gpu_milli=1000),
        PodRequest("eight", cpu_milli=64000, gpu_count=8, gpu_milli=1000),
        PodRequest("eight-spec", cpu_milli=64000, gpu_count=8, gpu_milli=1000, gpu_models=frozenset({"G2"})),
    ]


def test_classes() -> None:
    got = {p.name: pod_classes(p) for p in pods()}
    assert got == {
        "cpu": {"cpu"},
        "share": {"share"},
        "one": {"single"},
        "two": {"multi"},
        "eight": {"multi", "whole"},
        "eight-spec": {"multi", "whole", "spec"},
    }
    assert pod_classes(pods()[3], largest=2) == {"multi", "whole"}


def test_factor_one_is_the_trace_itself() -> None:
    assert reweight(pods(), {}, 7) == pods()
    assert reweight(pods(), {"multi": 1.0, "cpu": 1.0}, 7) == pods()


def test_whole_factors_repeat_their_class_and_multiply() -> None:
    out = reweight(pods(), {"multi": 3, "spec": 2}, 1)
    names = [p.name for p in out]
    assert len(names) == len(set(names)) and len({p.uid for p in out}) == len(out)
    base = Counter(n.split("-r")[0] for n in names)
    assert base == {"cpu": 1, "share": 1, "one": 1, "two": 3, "eight": 3, "eight-spec": 6}
    assert names[:4] == ["cpu", "share", "one", "two"] and names[4] == "two-r1"


def test_fractional_factors_subsample_by_seed() -> None:
    many = [PodRequest(f"c{i}", cpu_milli=1000) for i in range(2000)]
    half = reweight(many, {"cpu": 0.5}, 3)
    assert 900 < len(half) < 1100
    assert reweight(many, {"cpu": 0.5}, 3) == half
    assert reweight(many, {"cpu": 0.5}, 4) != half
    assert 4800 < len(reweight(many, {"cpu": 2.5}, 3)) < 5200


@pytest.mark.parametrize("factors", [{"gpu": 2.0}, {"multi": -1.0}, {"multi": float("nan")}, {"cpu": 1000.0}])
def test_bad_factors_are_refused(factors: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        reweight(pods(), factors, 1)


def test_nothing_left_is_refused() -> None:
    with pytest.raises(ValueError, match="no pod"):
        reweight(pods()[:1], {"cpu": 0}, 1)


def test_specs_name_a_model_that_has_nodes_of_enough_gpus() -> None:
    nodes = [NodeSpec("a", 64000, 1, 2, "T4"), NodeSpec("b", 96000, 1, 8, "G2"), NodeSpec("c", 1, 1, 8, "G3")]
    out = assign_specs(pods(), nodes, 1.0, 5)
    by = {p.name: p for p in out}
    assert by["cpu"].gpu_models == frozenset()
    assert by["eight-spec"].gpu_models == {"G2"}  # already asked: kept
    for name in ("share", "one", "two", "eight"):
        assert len(by[name].gpu_models) == 1
    assert by["eight"].gpu_models <= {"G2", "G3"}
    assert assign_specs(pods(), nodes, 0.0, 5) == pods()
    with pytest.raises(ValueError):
        assign_specs(pods(), nodes, 1.5, 5)


def test_spec_share_is_about_the_share_asked() -> None:
    nodes = load_nodes(DEFAULT_NODES)
    trace = load_pods(DEFAULT_PODS)
    out = assign_specs(trace, nodes, 0.3, 1)
    gpu = [p for p in out if p.gpu_count]
    share = sum(bool(p.gpu_models) for p in gpu) / len(gpu)
    assert 0.22 < share < 0.38
    models = {n.model for n in nodes}
    assert all(p.gpu_models <= models for p in out)


def test_written_mix_reads_back(tmp_path: Path) -> None:
    nodes = load_nodes(DEFAULT_NODES)
    mix = Mix("m", "default", {"multi": 2, "share": 0.5}, spec_share=0.2, mix_seed=9)
    out = mix.build(load_pods(DEFAULT_PODS), nodes)
    path = tmp_path / "mix.csv"
    write_pods(out, path)
    back = load_pods(path)
    assert [(p.name, p.cpu_milli, p.memory_mib, p.gpu_count, p.gpu_milli, p.gpu_models) for p in back] == [
        (p.name, p.cpu_milli, p.memory_mib, p.gpu_count, p.gpu_milli, p.gpu_models) for p in out
    ]


def test_the_bench_mix_file_keeps_tuning_and_held_out_apart() -> None:
    """No two sets (tuning, heldout, heldout2 .. heldout11) share a recipe or a protocol seed,
    and each has every family of trace shape."""
    sets = load_mixes(ROOT / "bench" / "openb_mixes.json")
    names = ("tuning", "heldout", *(f"heldout{k}" for k in range(2, 12)))
    assert set(names) <= set(sets)
    chosen_sets = [sets[name] for name in names]
    assert all(chosen_sets)

    def recipes(mixes: list) -> set:
        return {(m.trace, tuple(sorted(m.factors.items())), m.spec_share, m.mix_seed) for m in mixes}

    for i, one in enumerate(chosen_sets):
        for other in chosen_sets[i + 1 :]:
            assert not recipes(one) & recipes(other)
            assert not {s for m in one for s in m.seeds} & {s for m in other for s in m.seeds}
    families = {"multi", "whole", "share", "single", "cpu"}
    for chosen in chosen_sets:  # every family of trace shape is in every set
        seen = {c for m in chosen for c in m.factors} | (
            {"spec"} if any(m.spec_share for m in chosen) else set()
        )
        assert {"cpu", "share", "spec"} <= seen and seen & {"multi", "whole"} and seen <= families | {"spec"}


def test_mix_file_errors_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps({"s": [{"name": "a", "trace": "default", "factors": {"gpu": 2}, "seeds": [1]}]})
    )
    with pytest.raises(ValueError, match="'gpu'"):
        load_mixes(path)
    path.write_text(
        json.dumps(
            {"s": [{"name": "a", "trace": "d", "seeds": [1]}, {"name": "a", "trace": "d", "seeds": [2]}]}
        )
    )
    with pytest.raises(ValueError, match="twice"):
        load_mixes(path)


def test_cli_writes_a_mix_and_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mix.csv"
    args = ["--nodes", str(DEFAULT_NODES), "--pods", str(DEFAULT_PODS), "--factor", "multi=3", "--seed", "1"]
    assert mixes.main([*args, "--out", str(out)]) == 0
    counts = json.loads(capsys.readouterr().out)
    base = Counter("multi" in pod_classes(p) for p in load_pods(DEFAULT_PODS))
    assert counts["multi"] == 3 * base[True] and len(load_pods(out)) == counts["pods"]
    assert mixes.main([*args, "--factor", "gpus=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpus" in err[0]
