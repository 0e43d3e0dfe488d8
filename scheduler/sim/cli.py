"""``kubegpu simulate``: run the scheduling core against an in-memory cluster and a trace.

With no arguments it simulates the built-in default (58 nodes and 407 pods sampled from openb,
shipped in ``scheduler/data``) with the default policy over the protocol's 10 seeds. The kubegpu
CLI adds the subcommand with ``register(subparsers)``; ``python -m scheduler.sim.cli`` runs it alone.
Importing this module is cheap (numpy and the core load only when the command runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kubegpu import cliargs
from kubegpu.inputfiles import MAX_TRACE_BYTES

DEFAULT_POLICY = "fgd-reserve"  # == scheduler.core.policies.DEFAULT_POLICY (a test checks)
INFLATION = 1.3
MAX_INFLATION = 10.0  # == scheduler.sim.protocol.MAX_INFLATION (a test checks)
MAX_SEED = 2**32 - 1  # numpy's seeds
MAX_SEEDS = 10_000
MAX_UTILIZATION_WEIGHT = 1000.0  # == scheduler.live.config.MAX_UTILIZATION_WEIGHT (a test checks)
HOT_THRESHOLD = 80.0  # == scheduler.sim.protocol.HOT_THRESHOLD (a test checks)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``simulate`` subcommand; its handler is ``args.run(args) -> exit code``."""
    parser = subparsers.add_parser(
        "simulate",
        help="simulate scheduling policies on a GPU cluster trace (no cluster needed)",
        description=(
            "Run the scheduler's core in process against an in-memory cluster, with the FGD paper's "
            "protocol: seeded shuffle, inflation to 130%% of GPU capacity, one try per pod; report "
            "the GPU allocation ratio as requests arrive. Without --nodes/--pods: a built-in sample."
        ),
    )
    parser.add_argument(
        "--nodes",
        type=cliargs.input_file(MAX_TRACE_BYTES),
        metavar="NODES.csv",
        help="openb node list (sn,cpu_milli,...)",
    )
    parser.add_argument(
        "--pods",
        type=cliargs.input_file(MAX_TRACE_BYTES),
        metavar="PODS.csv",
        help="openb pod list (name,cpu_milli,...)",
    )
    parser.add_argument(
        "--policy", default=DEFAULT_POLICY, metavar="NAME", help="scoring policy (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=cliargs.count(0, MAX_SEED), action="append", metavar="N", help="a seed (repeatable)"
    )
    parser.add_argument(
        "--seeds",
        type=cliargs.parsed_by(_parse_seeds, "seeds as 42-51 or 42,44"),
        metavar="RANGE",
        help="seeds as 42-51 or 42,44 (default: 42-51)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument(
        "--plot", type=cliargs.output_file, metavar="FILE.png", help="write the allocation curve (matplotlib)"
    )
    parser.add_argument("--list-policies", action="store_true", help="list the policies and exit")
    parser.add_argument(
        "--inflation",
        type=cliargs.number(0.0, MAX_INFLATION, inclusive=True),
        default=INFLATION,
        metavar="RATIO",
        help="inflate the workload to this multiple of GPU capacity, 0: the trace once as it is "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--machine",
        action="append",
        default=[],
        metavar="MODEL=SHAPE",
        help="give nodes of GPU model MODEL the links of machine shape SHAPE (a shipped name such as "
        "dgx1-v100, a machine JSON file, or none); repeatable, over the built-in mapping",
    )
    parser.add_argument(
        "--no-topology", action="store_true", help="give no node link information (GPUs all equal)"
    )
    parser.add_argument(
        "--bound",
        action="store_true",
        help="also compute per seed an LP upper bound on the allocation at 100%% and 130%% arrived "
        "(scipy HiGHS; about 10 s per seed on openb)",
    )
    parser.add_argument(
        "--ties",
        choices=("node-order", "random"),
        default="node-order",
        help="equal scores: first node of a seeded node order, as the FGD simulator (default), "
        "or uniformly at random, as stock kube-scheduler",
    )
    parser.add_argument(
        "--gang-mode",
        choices=("gang", "none"),
        default="gang",
        help="pod groups of the trace (columns gang, gang_min): each tried whole when its last member "
        "arrives (default), or none: members one by one as any pod, the baseline that leaves groups partial",
    )
    parser.add_argument(
        "--gang-arrival",
        choices=("together", "spread"),
        default="together",
        help="a group's members arrive one after another (default), or each at a random slot among the "
        "gang members' slots",
    )
    parser.add_argument(
        "--utilization-weight",
        type=cliargs.number(0.0, MAX_UTILIZATION_WEIGHT, inclusive=True),
        default=0.0,
        metavar="W",
        help="add W x the live utilisation term to the policy, as the scheduler's utilizationWeight "
        "(the nodes' gpu_util column; docs/simulator.md) (default: %(default)s)",
    )
    parser.add_argument(
        "--hot-threshold",
        type=cliargs.number(0.0, 100.0, inclusive=True),
        default=HOT_THRESHOLD,
        metavar="PERCENT",
        help="the report counts the GPU placed on nodes busier than this by their gpu_util "
        "(default: %(default)s)",
    )
    parser.set_defaults(run=run)
    return parser


def _parse_seeds(text: str) -> list[int]:
    from scheduler.sim.runner import parse_seeds

    for part in text.split(","):
        low, dash, high = part.partition("-")
        if dash and low.strip().isdigit() and high.strip().isdigit() and int(high) - int(low) >= MAX_SEEDS:
            raise ValueError(f"range {part.strip()} holds more than {MAX_SEEDS} seeds")
    seeds = parse_seeds(text)
    if len(seeds) > MAX_SEEDS:
        raise ValueError(f"{len(seeds)} seeds (at most {MAX_SEEDS})")
    if not all(0 <= seed <= MAX_SEED for seed in seeds):
        raise ValueError(f"seeds must be 0 to {MAX_SEED}")
    return seeds


def list_policies() -> str:
    from scheduler.core.policies import POLICIES, make_policy

    lines = []
    for name in POLICIES:
        mark = " (default)" if name == DEFAULT_POLICY else ""
        lines.append(f"{name:<14} {make_policy(name).description}{mark}")
    return "\n".join(lines)


def _seeds(args: argparse.Namespace) -> list[int]:
    from scheduler.sim.runner import PROTOCOL_SEEDS

    seeds = list(args.seed or []) + list(args.seeds or [])
    return seeds or list(PROTOCOL_SEEDS)


def run(args: argparse.Namespace) -> int:
    """Handle ``kubegpu simulate``; returns the exit code."""
    from scheduler.core.policies import POLICIES
    from scheduler.sim.machines import MachineError, parse_mapping, resolve
    from scheduler.sim.report import plot_curves, text_report
    from scheduler.sim.runner import run_experiment
    from scheduler.sim.trace import DEFAULT_NODES, DEFAULT_PODS, load_nodes, load_workload, with_shapes

    if args.list_policies:
        print(list_policies())
        return 0
    if (args.nodes is None) != (args.pods is None):
        print("kubegpu simulate: give both --nodes and --pods, or neither", file=sys.stderr)
        return 2
    if args.policy not in POLICIES:
        print(f"kubegpu simulate: unknown policy {args.policy!r} (see --list-policies)", file=sys.stderr)
        return 2
    nodes_path = args.nodes or DEFAULT_NODES
    pods_path = args.pods or DEFAULT_PODS
    try:
        if not 0 <= args.inflation <= MAX_INFLATION:  # NaN fails too
            raise ValueError(f"--inflation must be in [0, {MAX_INFLATION:g}], not {args.inflation!r}")
        seeds = _seeds(args)
        nodes = load_nodes(nodes_path)
        workload = load_workload(pods_path)
        if args.no_topology and args.machine:
            raise MachineError("--machine and --no-topology exclude each other")
        if not args.no_topology:
            nodes = with_shapes(nodes, resolve(parse_mapping(args.machine)))
    except (OSError, ValueError) as exc:  # TraceError and MachineError are ValueErrors
        print(f"kubegpu simulate: {exc}", file=sys.stderr)
        return 2
    if args.bound:
        try:
            import scipy.optimize  # noqa: F401
        except ImportError:
            print("kubegpu simulate: --bound needs scipy (pip install 'kubegpu[bound]')", file=sys.stderr)
            return 2
    experiment = run_experiment(
        nodes,
        workload.pods,
        args.policy,
        seeds,
        args.inflation,
        args.ties,
        args.bound,
        workload.gangs,
        args.gang_mode,
        args.gang_arrival,
        args.utilization_weight,
        args.hot_threshold,
    )
    if args.plot:
        try:
            plot_curves([experiment], args.plot, title=f"{pods_path.name} on {nodes_path.name}")
        except OSError as exc:
            print(f"kubegpu simulate: cannot write the plot: {exc}", file=sys.stderr)
            return 2
        except ImportError as exc:
            hint = "--plot needs matplotlib (pip install 'kubegpu[plot]')"
            print(f"kubegpu simulate: {hint}: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(experiment.to_json(), allow_nan=False))
    else:
        builtin = " (built-in sample of openb)" if args.nodes is None else ""
        cluster = f"{len(nodes)} nodes from {nodes_path.name}{builtin}"
        count = len(workload.gangs)
        gangs = f" ({count} pod group{'s' if count != 1 else ''})" if count else ""
        print(text_report(experiment, cluster, f"{len(workload.pods)} pods{gangs} from {pods_path.name}"))
        if args.plot:
            print(f"  curve written to {args.plot}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry: ``python -m scheduler.sim.cli simulate ...`` (or without ``simulate``)."""
    parser = cliargs.Parser(prog="python -m scheduler.sim.cli")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "simulate":
        argv = ["simulate", *argv]
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # a usage error (one line already on stderr), or --help
        return int(done.code or 0)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
