"""The ``kubegpu`` command line: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from devices.cli import register as _add_devices
from kubegpu import __version__, logs


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
    _add_device_options(parser)
    parser.set_defaults(run=_run_crishim)


def _add_device_options(parser: argparse.ArgumentParser) -> None:
    devices = parser.add_argument_group("device allocation (without --device-plugin: a plain proxy)")
    devices.add_argument("--device-plugin", action="append", default=[], metavar="NAME",
                         help="device plugin to load: nvidia, rdma, sim (repeatable)")
    devices.add_argument("--node-name", default=socket.gethostname(),
                         help="this node's name in Kubernetes (default: the hostname)")
    devices.add_argument("--allocation-keys-dir", default="/etc/kubegpu/keys", type=Path,
                         help="mounted signing-key Secret, one file per key id (default: %(default)s)")
    devices.add_argument("--sim-topology", help="sim plugin: topology file or shipped name")
    devices.add_argument("--sim-state-dir", default="/var/lib/kubegpu/sim",
                         help="sim plugin: where the fake device nodes live (default: %(default)s)")
    devices.add_argument("--sysfs-root", default="/", help="rdma plugin and NIC affinity: sysfs root")
    devices.add_argument("--health-interval", type=float, default=10.0, metavar="SECONDS",
                         help="how often device health is re-read (default: %(default)s)")
    devices.add_argument("--kubeconfig", default=None,
                         help="API access for pods whose sandbox lacks the allocation (default: "
                              "in-cluster config if present, else no API fallback)")


def _run_crishim(args: argparse.Namespace) -> int:
    from crishim.assemble import build_rewriter
    from crishim.server import ShimConfig, ShimConfigError, serve
    from devices.plugin import PluginError

    config = ShimConfig(
        listen=args.listen,
        runtime_endpoint=args.runtime_endpoint,
        metrics_address=args.metrics_address,
        drain_seconds=args.drain_timeout,
        health_interval=args.health_interval,
    )
    try:
        interceptor = build_rewriter(args) if args.device_plugin else None
        asyncio.run(serve(config, interceptor))
    except (ShimConfigError, PluginError) as exc:
        print(f"kubegpu crishim: {exc}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubegpu", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kubegpu {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_crishim(sub)
    _add_devices(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
