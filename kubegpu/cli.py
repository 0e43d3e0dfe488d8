"""The ``kubegpu`` command line: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

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
    parser.set_defaults(run=_run_crishim)


def _run_crishim(args: argparse.Namespace) -> int:
    from crishim.server import ShimConfig, ShimConfigError, serve

    config = ShimConfig(
        listen=args.listen,
        runtime_endpoint=args.runtime_endpoint,
        metrics_address=args.metrics_address,
        drain_seconds=args.drain_timeout,
    )
    try:
        asyncio.run(serve(config))
    except ShimConfigError as exc:
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
