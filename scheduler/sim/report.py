"""Presenting simulation results: a readable text report, and the allocation curve as a PNG."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from scheduler.sim.protocol import GangStats
from scheduler.sim.runner import Experiment

CURVE_POINTS = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130)
BAR_WIDTH = 40


def _fmt(value: float) -> str:
    return "   -  " if math.isnan(value) else f"{value:6.2f}"


def text_report(experiment: Experiment, cluster: str, workload: str) -> str:
    """Per-seed headline numbers, their mean and spread, and the mean curve as bars."""
    runs = experiment.runs
    first = runs[0]
    gangs = experiment.gangs()
    lines = [
        f"kubegpu simulate: policy {experiment.policy}",
        f"  cluster:  {cluster} ({first.capacity_milli // 1000} GPUs)",
        f"  workload: {workload}",
        "  protocol: seeded shuffle, inflation to 130% of GPU capacity, one try per pod"
        + (" (per pod group)" if gangs is not None and gangs.mode == "gang" else ""),
        "",
        "  seed   alloc% @100  alloc% @130   pods  placed  seconds",
    ]
    for r in runs:
        lines.append(
            f"  {r.seed:>4}   {_fmt(r.alloc_pct_at_100)}       {_fmt(r.alloc_pct_at_130)}"
            f"       {r.pods:>5}  {r.placed:>6}  {r.seconds:7.2f}"
        )
    lines.append(
        f"  mean   {_fmt(experiment.mean_at(100))}       {_fmt(experiment.mean_at(130))}"
        f"       (spread {experiment.spread_at(100):.2f} / {experiment.spread_at(130):.2f}"
        f" over {len(runs)} seed{'s' if len(runs) != 1 else ''})"
    )
    if experiment.bounds:
        lines += ["", "  upper bound on the allocation (LP, all arrived pods known; see docs/simulator.md):"]
        for x in (100, 130):
            bound = experiment.bound_at(x)
            if not math.isnan(bound):
                lines.append(
                    f"  @{x}: bound {bound:6.2f}   {experiment.policy} {experiment.mean_at(x):6.2f}"
                    f"   gap {bound - experiment.mean_at(x):5.2f} points"
                )
    links = experiment.links().summary()
    if links["multi_gpu_pods"]:
        lines += [
            "",
            f"  link quality of the {links['multi_gpu_pods']} multi-GPU pods placed on nodes with links:",
            f"  mean link score {links['mean_link_score']:.1f} ({links['relative_link_score']:.3f} of the"
            f" idle node's best set), all-NVLink {100 * links['all_nvlink_share']:.1f}%,"
            f" across sockets {100 * links['cross_socket_share']:.1f}%",
        ]
    elif links["multi_gpu_pods_without_links"]:
        lines += ["", "  link quality: the nodes have no link information (see --machine)"]
    lines += gang_report(experiment)
    lines += utilization_report(experiment)
    lines += rdma_report(experiment)
    lines += ["", "  GPU allocation (% of capacity) as GPU requests arrive (% of capacity):"]
    curve = experiment.mean_curve()
    for x in CURVE_POINTS:
        if x in curve:
            y = curve[x]
            lines.append(f"  {x:>4}% arrived  {y:6.2f}%  " + "#" * max(0, round(y / 100 * BAR_WIDTH)))
    lines.append(f"\n  {experiment.seconds:.2f} s in all")
    return "\n".join(lines)


GANG_MODE_TEXT = {
    "gang": "gang (a group whole or not at all, tried when its last member arrives)",
    "none": "none (members one by one, as any pod: groups can be left partial)",
}
GANG_ARRIVAL_TEXT = {
    "together": "a group's members arrive one after another",
    "spread": "gang members arrive each at a random slot",
}


def _waits(stats: GangStats) -> str:
    return " / ".join("-" if v is None else str(v) for v in stats.percentiles().values())


def gang_report(experiment: Experiment) -> list[str]:
    """The lines on pod groups (none for a workload without gangs)."""
    total = experiment.gangs()
    if total is None:
        return []
    lines = [
        "",
        f"  gang workloads: mode {GANG_MODE_TEXT.get(total.mode, total.mode)};",
        f"  {GANG_ARRIVAL_TEXT.get(total.arrival, total.arrival)}. Idle: GPUs held by placed members of",
        "  groups not yet whole, x arrival events; time to place: arrival events from a group's first",
        "  member to its minimum placed (p50 / p90 / p99):",
        "  seed  groups  whole  partial  unplaced  idle GPU x events  idle GPUs at end  time to place",
    ]
    rows = [(str(r.seed), r.gangs) for r in experiment.runs if r.gangs is not None]
    if len(rows) > 1:
        rows.append(("all", total))
    for label, g in rows:
        assert g is not None
        lines.append(
            f"  {label:>4}  {g.groups:>6}  {g.whole:>5}  {g.partial:>7}  {g.unplaced:>8}"
            f"  {g.idle_milli_events / 1000:>17.3f}  {g.idle_milli_end / 1000:>16.3f}  {_waits(g)}"
        )
    return lines


def utilization_report(experiment: Experiment) -> list[str]:
    """The lines on the nodes' utilisation column (none without it): how much went to hot nodes with
    the readings and with them ignored."""
    doc = experiment.utilization_summary()
    if doc is None:
        return []
    term = f"+ {doc['weight']:g} x the live term" if doc["weight"] else "no utilizationWeight"
    lines = [
        "",
        f"  live utilisation (gpu_util): {doc['hot_nodes']} hot nodes, busier than"
        f" {doc['hot_threshold_pct']:g}% ({doc['hot_gpu_pct']:.1f}% of the GPUs);"
        f" policy {experiment.policy}, {term}.",
        "  GPU placed on hot nodes, at the end and over time (GPU x arrival events), and the allocation:",
        "                      on hot nodes  hot GPU x events  alloc% @100  alloc% @130",
    ]
    for key, label in (("with_readings", "with the readings"), ("without_readings", "readings ignored")):
        row = doc[key]
        at100 = float("nan") if row["mean_alloc_pct_at_100"] is None else row["mean_alloc_pct_at_100"]
        at130 = float("nan") if row["mean_alloc_pct_at_130"] is None else row["mean_alloc_pct_at_130"]
        lines.append(
            f"  {label:<18}  {row['hot_placed_pct']:>11.2f}%  {row['hot_gpu_time_pct']:>15.2f}%"
            f"  {_fmt(at100)}       {_fmt(at130)}"
        )
    return lines


def rdma_report(experiment: Experiment) -> list[str]:
    """The lines on RDMA pods (none when no pod asks for RDMA interfaces), summed over the seeds."""
    total = experiment.rdma()
    if total is None:
        return []
    doc = total.summary()
    return [
        "",
        f"  RDMA pods (all seeds): {doc['pods']} arrived, {doc['placed']} placed"
        f" ({doc['interfaces_placed']} interfaces); failed for RDMA alone: {doc['failed_vfs']} too few"
        f" free VFs, {doc['failed_bandwidth']} too little PF bandwidth; {doc['failed_other']} failed"
        " otherwise;",
        f"  highest PF load at the end {doc['peak_pf_load_pct']:.1f}% of its line rate",
    ]


def plot_curves(experiments: Sequence[Experiment], path: str | Path, title: str = "") -> None:
    """Allocation curves (mean over seeds; each seed faint) of one or more policies to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for exp in experiments:
        curve = exp.mean_curve()
        xs = sorted(curve)
        (line,) = ax.plot(xs, [curve[x] for x in xs], label=f"{exp.policy} ({exp.mean_at(130):.2f}% @130)")
        for r in exp.runs if len(exp.runs) > 1 else ():
            rx = sorted(r.curve)
            ax.plot(rx, [r.curve[x] for x in rx], color=line.get_color(), alpha=0.15, linewidth=0.8)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=0.8, label="everything placed")
    ax.set_xlabel("arrived GPU requests (% of cluster GPU capacity)")
    ax.set_ylabel("allocated GPUs (% of capacity)")
    ax.set_xlim(0, 130)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
