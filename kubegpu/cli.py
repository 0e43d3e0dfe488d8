"""The ``kubegpu`` command line: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devices.cli import register as _add_devices
from kubegpu import __version__, logs
from kubegpu.keyscli import register as _add_keys
from kubegpu.localcluster.cli import register as _add_localcluster
from kubegpu.nodeinstall import register as _add_node
from scheduler.sim.cli import register as _add_simulate


def run_loop(main: Any) -> None:
    """Run a coroutine on uvloop: its event loop costs the proxy about 0.05 ms less per call than
    asyncio's (bench/proxy_overhead.py); gRPC's aio stack runs on it unchanged."""
    import uvloop

    uvloop.run(main)


def _add_crishim(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "crishim",
        help="run the CRI shim between kubelet and the container runtime",
        description="Proxy the CRI v1 API from kubelet to containerd, rewriting CreateContainer.",
    )
    parser.add_argument(
        "--listen",
        default="unix:///run/kubegpu/crishim.sock",
        help="unix socket kubelet connects to (default: %(default)s)",
    )
    parser.add_argument(
        "--runtime-endpoint",
        default="unix:///run/containerd/containerd.sock",
        help="the container runtime's CRI socket (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-address",
        default=None,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz here (default: off)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="on SIGTERM, wait this long for in-flight calls (default: %(default)s)",
    )
    parser.add_argument(
        "--pod-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="watch this node's pods (needs list/watch on pods) so creates of pods without an "
        "allocation need no API read; a pod the watch has not seen is still read (default: on)",
    )
    _add_device_options(parser)
    parser.set_defaults(run=_run_crishim)


def _add_device_options(parser: argparse.ArgumentParser) -> None:
    devices = parser.add_argument_group("device allocation (without --device-plugin: a plain proxy)")
    devices.add_argument(
        "--device-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="device plugin to load: nvidia, rdma, sim (repeatable)",
    )
    devices.add_argument(
        "--node-name",
        default=socket.gethostname(),
        help="this node's name in Kubernetes (default: the hostname)",
    )
    devices.add_argument(
        "--allocation-keys-dir",
        default="/etc/kubegpu/keys",
        type=Path,
        help="mounted signing-key Secret, one file per key id (default: %(default)s)",
    )
    devices.add_argument("--sim-topology", help="sim plugin: topology file or shipped name")
    devices.add_argument(
        "--sim-state-dir",
        default="/var/lib/kubegpu/sim",
        help="sim plugin: where the fake device nodes live (default: %(default)s)",
    )
    devices.add_argument("--sysfs-root", default="/", help="rdma plugin and NIC affinity: sysfs root")
    devices.add_argument(
        "--health-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often device health is re-read (default: %(default)s)",
    )
    devices.add_argument(
        "--mps-control",
        default="nvidia-cuda-mps-control",
        metavar="PATH",
        help="MPS control binary: GPU shares are enforced through MPS where it is found "
        "(docs/gpu-sharing.md); '' turns enforcement off (default: %(default)s)",
    )
    devices.add_argument(
        "--mps-dir",
        default="/run/kubegpu/mps",
        help="the MPS daemons' pipe, log and shm directories, one folder per GPU (default: %(default)s)",
    )
    devices.add_argument(
        "--mps-compute-mode",
        choices=["exclusive", "unchanged"],
        default="exclusive",
        help="nvidia: put a GPU in EXCLUSIVE_PROCESS compute mode while its MPS daemon runs "
        "(default: %(default)s)",
    )
    devices.add_argument(
        "--kubeconfig",
        default=None,
        help="API access (advertiser, and pods whose sandbox lacks the allocation); "
        "default: in-cluster config if present, else none",
    )
    devices.add_argument(
        "--advertise", action="store_true", help="crishim: also run the advertiser loop (needs API access)"
    )
    devices.add_argument(
        "--advertise-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often the Node is compared with the devices (default: %(default)s)",
    )
    devices.add_argument(
        "--heartbeat-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="heartbeat annotation refresh period (default: %(default)s)",
    )


def _run_crishim(args: argparse.Namespace) -> int:
    from crishim import grpc_settings

    grpc_settings.apply()  # before grpc is imported: gRPC core reads it once, at import
    from crishim.assemble import build_advertiser, build_rewriter, node_devices_from
    from crishim.server import ShimConfig, ShimConfigError, serve
    from devices.plugin import PluginError
    from kubegpu.kube import api_client

    config = ShimConfig(
        listen=args.listen,
        runtime_endpoint=args.runtime_endpoint,
        metrics_address=args.metrics_address,
        drain_seconds=args.drain_timeout,
        health_interval=args.health_interval,
    )
    advertiser = None
    try:
        interceptor = None
        if args.device_plugin:
            node_devices = node_devices_from(args)
            api = api_client(args.kubeconfig)
            interceptor = build_rewriter(args, node_devices, api)
            if args.advertise:
                if api is None:
                    raise ShimConfigError("--advertise needs --kubeconfig or an in-cluster service account")
                advertiser = build_advertiser(args, node_devices, api)
                advertiser.start()
        run_loop(serve(config, interceptor))
    except (ShimConfigError, PluginError) as exc:
        print(f"kubegpu crishim: {exc}", file=sys.stderr)
        return 2
    finally:
        if advertiser is not None:
            advertiser.stop()
    return 0


def _add_advertise(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "advertise",
        help="publish this node's devices on its Node object",
        description="Discover devices with the given plugins and publish inventory, topology, "
        "capacity and a heartbeat on the Node (the crishim does this continuously with --advertise).",
    )
    parser.add_argument("--once", action="store_true", help="publish once and exit")
    parser.add_argument("--dry-run", action="store_true", help="print what would be published; no API call")
    _add_device_options(parser)
    parser.set_defaults(run=_run_advertise)


def _run_advertise(args: argparse.Namespace) -> int:
    import json

    from crishim.advertiser import publication
    from crishim.assemble import build_advertiser, node_devices_from
    from devices.plugin import PluginError
    from kubegpu.kube import api_client

    try:
        node_devices = node_devices_from(args)
        inventory = node_devices.current_inventory()  # raises if discovery failed
    except PluginError as exc:
        print(f"kubegpu advertise: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        wanted = publication(inventory)
        print(json.dumps({"node": args.node_name, **wanted.as_dict()}, indent=2, sort_keys=True))
        return 0
    api = api_client(args.kubeconfig)
    if api is None:
        print("kubegpu advertise: needs --kubeconfig or an in-cluster service account", file=sys.stderr)
        return 2
    advertiser = build_advertiser(args, node_devices, api)
    if args.once:
        print(json.dumps({"node": args.node_name, "wrote": advertiser.sync_once()}))
        return 0
    advertiser.run()
    return 0


def _add_scheduler(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "scheduler",
        help="run the topology-aware device scheduler against a cluster",
        description="Schedule pods whose spec.schedulerName names this scheduler, binding each with its "
        "signed device allocation. Flags override the config file (docs/scheduler.md).",
    )
    parser.add_argument("--config", help="scheduler config file (YAML)")
    parser.add_argument("--kubeconfig", help="API access (default: in-cluster service account)")
    parser.add_argument("--scheduler-name", help="the spec.schedulerName this replica serves")
    parser.add_argument("--policy", help="node scoring policy (kubegpu simulate --list-policies)")
    parser.add_argument("--metrics-address", metavar="HOST:PORT", help="serve /metrics, /healthz, /readyz")
    parser.add_argument("--keys-dir", help="mounted signing-key Secret directory")
    parser.add_argument("--signing-key-id", help="key id to sign allocations with")
    parser.add_argument("--leader-elect", action="store_true", default=None, help="run Lease leader election")
    parser.add_argument("--identity", help="this replica's identity (default: hostname)")
    parser.set_defaults(run=_run_scheduler)


def _run_scheduler(args: argparse.Namespace) -> int:
    from scheduler.live.config import ConfigError, load_config
    from scheduler.live.main import run_scheduler

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"kubegpu scheduler: {exc}", file=sys.stderr)
        return 2
    for flag, attr in (
        ("scheduler_name", "scheduler_name"),
        ("policy", "policy"),
        ("metrics_address", "metrics_address"),
        ("keys_dir", "keys_dir"),
        ("signing_key_id", "signing_key_id"),
        ("identity", "identity"),
    ):
        value = getattr(args, flag)
        if value is not None:
            setattr(config, attr, value)
    if args.leader_elect:
        config.leader_election.enabled = True
    return run_scheduler(config, args.kubeconfig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubegpu", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kubegpu {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_crishim(sub)
    _add_advertise(sub)
    _add_devices(sub)
    _add_scheduler(sub)
    _add_simulate(sub)
    _add_keys(sub)
    _add_localcluster(sub)
    _add_node(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
