"""The ``kubegpu`` command line: one entry point, one subcommand per component.

Every subcommand runs inside ``cliargs.run_command``: bad input is one line on stderr and exit
status 2, a runtime failure one line and 1, a traceback only with ``--log-level debug``
(docs/errors.md).
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devices.cli import register as _add_devices
from devices.registry import plugin_names
from kubegpu import __version__, cliargs, logs
from kubegpu.cliargs import Failure, UsageError
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
        type=cliargs.unix_endpoint,
        help="unix socket kubelet connects to (default: %(default)s)",
    )
    parser.add_argument(
        "--runtime-endpoint",
        default="unix:///run/containerd/containerd.sock",
        type=cliargs.unix_endpoint,
        help="the container runtime's CRI socket (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-address",
        default=None,
        type=cliargs.listen_address,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz here (default: off)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=cliargs.duration(allow_zero=True),
        default=5.0,
        metavar="SECONDS",
        help="on SIGTERM, wait this long for in-flight calls; 0: stop at once (default: %(default)s)",
    )
    parser.add_argument(
        "--front",
        choices=("cri", "nri"),
        default="cri",
        help="cri: serve kubelet's CRI calls as a proxy in front of the runtime; nri: register "
        "with containerd 2.x as an NRI plugin instead (nothing on kubelet's call path; needs "
        "--device-plugin; docs/nri.md) (default: %(default)s)",
    )
    parser.add_argument(
        "--nri-socket",
        default="/var/run/nri/nri.sock",
        type=cliargs.unix_endpoint,
        help="--front nri: containerd's NRI socket (default: %(default)s)",
    )
    parser.add_argument(
        "--nri-plugin-name",
        default="kubegpu",
        type=cliargs.dns_subdomain,
        help="--front nri: the plugin's name, as containerd's required_plugins lists it "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--nri-plugin-index",
        default="10",
        type=cliargs.two_digits,
        help="--front nri: the plugin's two-digit index, its place among NRI plugins (default: %(default)s)",
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
        choices=plugin_names(),
        metavar="NAME",
        help="device plugin to load: nvidia, rdma, sim (repeatable)",
    )
    devices.add_argument(
        "--node-name",
        type=cliargs.node_name,
        help="this node's name in Kubernetes (default: the hostname in lowercase, as kubelet's)",
    )
    devices.add_argument(
        "--allocation-keys-dir",
        default="/etc/kubegpu/keys",
        type=cliargs.absent_or_directory,
        help="mounted signing-key Secret, one file per key id (default: %(default)s)",
    )
    devices.add_argument(
        "--allow-sys-admin-namespace",
        action="append",
        default=[],
        type=cliargs.dns_subdomain,
        metavar="NAMESPACE",
        help="create containers given CAP_SYS_ADMIN in this namespace (repeatable; by default they "
        "are refused: they can lift their device cgroup); each is logged",
    )
    devices.add_argument("--sim-topology", help="sim plugin: topology file or shipped name")
    devices.add_argument(
        "--sim-state-dir",
        default="/var/lib/kubegpu/sim",
        type=cliargs.absent_or_directory,
        help="sim plugin: where the fake device nodes live (default: %(default)s)",
    )
    devices.add_argument(
        "--sysfs-root", default="/", type=cliargs.directory, help="rdma plugin and NIC affinity: sysfs root"
    )
    devices.add_argument(
        "--health-interval",
        type=cliargs.duration(),
        default=10.0,
        metavar="SECONDS",
        help="how often device health is re-read (default: %(default)s)",
    )
    devices.add_argument(
        "--telemetry-interval",
        type=cliargs.duration(allow_zero=True),
        default=15.0,
        metavar="SECONDS",
        help="crishim: how often per-GPU live metrics are sampled for /metrics (DCGM names, "
        "docs/crishim.md); 0 turns them off (default: %(default)s)",
    )
    devices.add_argument(
        "--metrics-publish-interval",
        type=cliargs.duration(allow_zero=True),
        default=30.0,
        metavar="SECONDS",
        help="crishim --advertise: how often the GPUs' smoothed readings are compared with what the "
        "node's NodeGpuMetric says, for the scheduler (docs/utilisation.md); 0 turns publishing off "
        "(default: %(default)s)",
    )
    devices.add_argument(
        "--metrics-publish-refresh",
        type=cliargs.duration(),
        default=300.0,
        metavar="SECONDS",
        help="rewrite the NodeGpuMetric at least this often while nothing moves; keep it below the "
        "scheduler's utilizationStaleSeconds (default: %(default)s)",
    )
    devices.add_argument(
        "--metrics-utilization-threshold",
        type=cliargs.number(0.0, 100.0, inclusive=True),
        default=5.0,
        metavar="POINTS",
        help="write when a GPU's utilisation moved this many points (default: %(default)s)",
    )
    devices.add_argument(
        "--metrics-memory-threshold",
        type=cliargs.number(0.0, 100.0, inclusive=True),
        default=5.0,
        metavar="PERCENT",
        help="write when a GPU's memory in use moved this %% of its memory (default: %(default)s)",
    )
    devices.add_argument(
        "--nrt-publish-interval",
        type=cliargs.duration(allow_zero=True),
        default=30.0,
        metavar="SECONDS",
        help="crishim --advertise: how often the node's NodeResourceTopology (its GPUs per NUMA zone, "
        "docs/nrt.md) is compared with what was written; 0 turns it off (default: %(default)s)",
    )
    devices.add_argument(
        "--nrt-host-resources",
        action="store_true",
        help="also list each NUMA zone's cpu and memory as the kernel counts them (right only where the "
        "kubelet's CPU and memory managers book nothing exclusively, docs/nrt.md)",
    )
    devices.add_argument(
        "--nrt-topology-manager-policy",
        choices=("none", "best-effort", "restricted", "single-numa-node"),
        default="",
        help="the kubelet's Topology Manager policy, published as the NodeResourceTopology's "
        "topologyManagerPolicy attribute (default: not published)",
    )
    devices.add_argument(
        "--nrt-topology-manager-scope",
        choices=("container", "pod"),
        default="container",
        help="the kubelet's Topology Manager scope, published with the policy (default: %(default)s)",
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
        type=cliargs.absent_or_directory,
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
        type=cliargs.readable_file,
        help="API access (advertiser, and pods whose sandbox lacks the allocation); "
        "default: in-cluster config if present, else none",
    )
    devices.add_argument(
        "--advertise", action="store_true", help="crishim: also run the advertiser loop (needs API access)"
    )
    devices.add_argument(
        "--advertise-interval",
        type=cliargs.duration(),
        default=10.0,
        metavar="SECONDS",
        help="how often the Node is compared with the devices (default: %(default)s)",
    )
    devices.add_argument(
        "--heartbeat-interval",
        type=cliargs.duration(),
        default=30.0,
        metavar="SECONDS",
        help="heartbeat annotation refresh period (default: %(default)s)",
    )


def _node_name(args: argparse.Namespace) -> str:
    """``--node-name``, else the hostname in lowercase (kubelet's default); UsageError if invalid."""
    if args.node_name is None:
        hostname = socket.gethostname().lower()
        try:
            args.node_name = cliargs.node_name(hostname)
        except argparse.ArgumentTypeError:
            raise UsageError(
                f"the hostname {hostname!r} is not a Kubernetes node name: give --node-name"
            ) from None
    return str(args.node_name)


def _preflight_crishim(args: argparse.Namespace) -> None:
    """What can be refused before anything starts (and before the first log line)."""
    from crishim.server import ShimConfigError, prepare_socket_path, unix_path

    listen, runtime = unix_path(args.listen), unix_path(args.runtime_endpoint)
    if listen.resolve() == runtime.resolve():
        raise UsageError(f"--listen and --runtime-endpoint are the same socket ({listen})")
    if args.advertise and not args.device_plugin:
        raise UsageError("--advertise needs --device-plugin (what would it publish?)")
    try:
        prepare_socket_path(listen)
    except ShimConfigError as exc:
        raise Failure(f"--listen {args.listen}: {exc}") from None
    except OSError as exc:
        raise Failure(f"--listen {args.listen}: {exc.filename or listen}: {exc.strerror or exc}") from None
    if args.metrics_address:
        cliargs.check_listen("--metrics-address", args.metrics_address)


def _run_crishim(args: argparse.Namespace) -> int:
    from crishim import grpc_settings

    grpc_settings.apply()  # before grpc is imported: gRPC core reads it once, at import
    from crishim.assemble import (
        build_advertiser,
        build_metrics_publisher,
        build_nrt_publisher,
        build_rewriter,
        build_telemetry,
        node_devices_from,
    )
    from crishim.server import ShimConfig, ShimConfigError, serve
    from devices.plugin import PluginError
    from kubegpu.kube import api_client

    if args.front == "nri":
        return _run_nri_front(args)
    config = ShimConfig(
        listen=args.listen,
        runtime_endpoint=args.runtime_endpoint,
        metrics_address=args.metrics_address,
        drain_seconds=args.drain_timeout,
        health_interval=args.health_interval,
    )
    _preflight_crishim(args)
    advertiser = publisher = topology = None
    try:
        interceptor = None
        telemetry = None
        if args.device_plugin:
            _node_name(args)
            api = api_client(args.kubeconfig)
            if args.advertise and api is None:
                raise UsageError("--advertise needs --kubeconfig or an in-cluster service account")
            node_devices = node_devices_from(args)
            interceptor = build_rewriter(args, node_devices, api)
            telemetry = build_telemetry(args, node_devices, interceptor)
            if args.advertise:
                advertiser = build_advertiser(args, node_devices, api)
                advertiser.start()
                publisher = build_metrics_publisher(args, telemetry, api)
                if publisher is not None:
                    publisher.start()
                topology = build_nrt_publisher(args, node_devices, interceptor, api)
                if topology is not None:
                    topology.start()
        run_loop(serve(config, interceptor, telemetry))
    except (ShimConfigError, PluginError) as exc:
        raise UsageError(str(exc)) from None
    finally:
        if advertiser is not None:
            advertiser.stop()
        if publisher is not None:
            publisher.stop()
        if topology is not None:
            topology.stop()
    return 0


def _run_nri_front(args: argparse.Namespace) -> int:
    """``kubegpu crishim --front nri``: the rewrite core as a containerd NRI plugin."""
    from crishim.assemble import (
        build_advertiser,
        build_metrics_publisher,
        build_nrt_publisher,
        build_rewriter,
        build_telemetry,
        node_devices_from,
    )
    from crishim.nri.agent import NriAgent, pod_security
    from crishim.nri.serve import NriConfig, serve_nri
    from crishim.podlookup import ApiPodLookup
    from crishim.server import unix_path
    from devices.plugin import PluginError
    from kubegpu.kube import api_client

    if not args.device_plugin:
        raise UsageError("--front nri needs at least one --device-plugin (it decides nothing else)")
    _preflight_crishim(args)
    _node_name(args)
    advertiser = publisher = topology = None
    try:
        api = api_client(args.kubeconfig)
        if args.advertise and api is None:
            raise UsageError("--advertise needs --kubeconfig or an in-cluster service account")
        node_devices = node_devices_from(args)
        rewriter = build_rewriter(args, node_devices, api)
        lookup = rewriter.pod_lookup
        agent = NriAgent(rewriter, pod_security(lookup) if isinstance(lookup, ApiPodLookup) else None)
        if not isinstance(lookup, ApiPodLookup):  # docs/nri.md, "Known limits"
            logs.log_event(
                logging.getLogger("kubegpu.nri"),
                "nri.security_unchecked",
                logging.WARNING,
                note="no API access: NRI shows no security context, so CAP_SYS_ADMIN containers are "
                "not refused; give the agent --kubeconfig or a service account",
            )
        telemetry = build_telemetry(args, node_devices, rewriter)
        if args.advertise:
            advertiser = build_advertiser(args, node_devices, api)
            advertiser.start()
            publisher = build_metrics_publisher(args, telemetry, api)
            if publisher is not None:
                publisher.start()
            topology = build_nrt_publisher(args, node_devices, rewriter, api)
            if topology is not None:
                topology.start()
        config = NriConfig(
            socket=unix_path(args.nri_socket),
            plugin_name=args.nri_plugin_name,
            plugin_index=args.nri_plugin_index,
            metrics_address=args.metrics_address,
            health_interval=args.health_interval,
        )
        run_loop(serve_nri(config, agent, telemetry))
    except PluginError as exc:
        raise UsageError(str(exc)) from None
    finally:
        if advertiser is not None:
            advertiser.stop()
        if publisher is not None:
            publisher.stop()
        if topology is not None:
            topology.stop()
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
    from kubegpu.kube import api_client, check_access, check_reachable

    if not args.device_plugin:
        raise UsageError("needs at least one --device-plugin")
    _node_name(args)
    api = None
    if not args.dry_run:
        api = api_client(args.kubeconfig)
        if api is None:
            raise UsageError("needs --kubeconfig or an in-cluster service account")
        if args.once:
            check_reachable(api)
    try:
        node_devices = node_devices_from(args)
        inventory = node_devices.current_inventory()  # raises if discovery failed
    except PluginError as exc:
        raise UsageError(str(exc)) from None
    if api is None:
        wanted = publication(inventory)
        print(json.dumps({"node": args.node_name, **wanted.as_dict()}, indent=2, sort_keys=True))
        return 0
    advertiser = build_advertiser(args, node_devices, api)
    written: list[list[str]] = []
    if args.once:
        check_access(f"publish on node {args.node_name}", lambda: written.append(advertiser.sync_once()))
        print(json.dumps({"node": args.node_name, "wrote": written[0]}))
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
    parser.add_argument("--config", type=cliargs.readable_file, help="scheduler config file (YAML)")
    parser.add_argument(
        "--kubeconfig", type=cliargs.readable_file, help="API access (default: in-cluster service account)"
    )
    parser.add_argument(
        "--scheduler-name", type=cliargs.dns_subdomain, help="the spec.schedulerName this replica serves"
    )
    parser.add_argument(
        "--policy",
        type=cliargs.one_of(_policy_names, "policy"),
        help="node scoring policy (kubegpu simulate --list-policies)",
    )
    parser.add_argument(
        "--metrics-address",
        type=cliargs.listen_address,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz, /readyz",
    )
    parser.add_argument("--keys-dir", type=cliargs.directory, help="mounted signing-key Secret directory")
    parser.add_argument("--signing-key-id", help="key id to sign allocations with")
    parser.add_argument("--leader-elect", action="store_true", default=None, help="run Lease leader election")
    parser.add_argument("--identity", help="this replica's identity (default: hostname)")
    parser.set_defaults(run=_run_scheduler)


def _add_extender(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "extender",
        help="serve kube-scheduler's extender protocol (filter, prioritize, bind) from kubegpu's core",
        description="Run kubegpu as an HTTP scheduler extender of kube-scheduler: kube-scheduler keeps "
        "choosing nodes, kubegpu filters and scores them by devices and binds with the signed "
        "allocation (docs/extender.md). --scheduler-name is the kube-scheduler profile whose pods "
        "it serves (default-scheduler).",
    )
    parser.add_argument("--config", type=cliargs.readable_file, help="scheduler config file (YAML)")
    parser.add_argument(
        "--kubeconfig", type=cliargs.readable_file, help="API access (default: in-cluster service account)"
    )
    parser.add_argument(
        "--scheduler-name",
        type=cliargs.dns_subdomain,
        default="default-scheduler",
        help="the kube-scheduler profile (spec.schedulerName) whose pods it serves (default: %(default)s)",
    )
    parser.add_argument(
        "--policy", type=cliargs.one_of(_policy_names, "policy"), help="node scoring policy for prioritize"
    )
    parser.add_argument(
        "--address",
        default="0.0.0.0:8888",
        type=cliargs.listen_address,
        metavar="HOST:PORT",
        help="serve the extender verbs, /healthz, /readyz and /metrics here (default: %(default)s)",
    )
    parser.add_argument(
        "--tls-cert-file", type=cliargs.readable_file, help="serve HTTPS with this certificate (PEM)"
    )
    parser.add_argument(
        "--tls-private-key-file", type=cliargs.readable_file, help="the certificate's private key (PEM)"
    )
    parser.add_argument("--keys-dir", type=cliargs.directory, help="mounted signing-key Secret directory")
    parser.add_argument("--signing-key-id", help="key id to sign allocations with")
    parser.add_argument("--leader-elect", action="store_true", default=None, help="run Lease leader election")
    parser.add_argument("--identity", help="this replica's identity (default: hostname)")
    parser.add_argument(
        "--advertise-address",
        dest="extender_advertise_address",
        metavar="HOST:PORT",
        help="where the other replicas reach this one (with --leader-elect a standby relays the "
        "verbs to the leader there; default: $POD_IP with --address's port)",
    )
    parser.set_defaults(run=_run_extender)


def _run_extender(args: argparse.Namespace) -> int:
    from kubegpu.kube import api_client, check_reachable
    from scheduler.live.main import run_extender

    if (args.tls_cert_file is None) != (args.tls_private_key_file is None):
        raise UsageError("--tls-cert-file and --tls-private-key-file go together")
    config = _scheduler_config(
        args,
        ("scheduler_name", "policy", "keys_dir", "signing_key_id", "identity", "extender_advertise_address"),
    )
    api = api_client(args.kubeconfig)
    if api is None:
        raise UsageError("needs --kubeconfig or an in-cluster service account")
    check_reachable(api)
    api.close()
    cliargs.check_listen("--address", args.address)
    tls = (str(args.tls_cert_file), str(args.tls_private_key_file)) if args.tls_cert_file else None
    return run_extender(config, str(args.kubeconfig) if args.kubeconfig else None, args.address, tls)


def _policy_names() -> list[str]:
    from scheduler.core.policies import POLICIES

    return list(POLICIES)


def _scheduler_keys(keys_dir: str, key_id: str) -> None:
    """The scheduler cannot sign without its private key: refuse to start without it."""
    from kubegpu.allocation import load_keys

    where = Path(keys_dir)
    if not where.is_dir():
        raise UsageError(f"keys directory {keys_dir}: {'not a directory' if where.exists() else 'not found'}")
    loaded = load_keys(where, allow_private=True)
    if key_id not in loaded.private:
        found = ", ".join(sorted(loaded.private)) or "none"
        skipped = f"; skipped: {'; '.join(loaded.problems)}" if loaded.problems else ""
        raise UsageError(
            f"signing key {key_id!r}: no private key of that id in {keys_dir} (found: {found}){skipped}"
        )


def _scheduler_config(args: argparse.Namespace, flags: tuple[str, ...]) -> Any:
    """The scheduler config file overlaid with the given flags (those set), validated, and its
    signing key present; UsageError naming what is wrong."""
    from scheduler.live.config import ConfigError, load_config, validate

    try:
        config = load_config(args.config)
    except ConfigError as exc:  # its message names the file
        raise UsageError(f"--config: {exc}") from None
    try:
        for flag in flags:
            value = getattr(args, flag)
            if value is not None:
                setattr(config, flag, value)
        if args.leader_elect:
            config.leader_election.enabled = True
        validate(config)
    except ConfigError as exc:
        raise UsageError(str(exc) if args.config is None else f"--config {args.config}: {exc}") from None
    _scheduler_keys(config.keys_dir, config.signing_key_id)
    return config


def _run_scheduler(args: argparse.Namespace) -> int:
    from kubernetes import client

    from kubegpu.kube import PROBE_TIMEOUT_SECONDS, api_client, check_access, check_reachable
    from scheduler.live.main import run_scheduler

    flags = ("scheduler_name", "policy", "metrics_address", "keys_dir", "signing_key_id", "identity")
    config = _scheduler_config(args, flags)
    api = api_client(args.kubeconfig)
    if api is None:
        raise UsageError("needs --kubeconfig or an in-cluster service account")
    check_reachable(api)
    core, timeout = client.CoreV1Api(api), PROBE_TIMEOUT_SECONDS
    check_access("list nodes", lambda: core.list_node(limit=1, _request_timeout=timeout))
    check_access("list pods", lambda: core.list_pod_for_all_namespaces(limit=1, _request_timeout=timeout))
    api.close()
    if config.metrics_address:
        cliargs.check_listen("--metrics-address", config.metrics_address)
    return run_scheduler(config, str(args.kubeconfig) if args.kubeconfig else None)


def build_parser() -> argparse.ArgumentParser:
    parser = cliargs.Parser(prog="kubegpu", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kubegpu {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_crishim(sub)
    _add_advertise(sub)
    _add_devices(sub)
    _add_scheduler(sub)
    _add_extender(sub)
    _add_simulate(sub)
    _add_keys(sub)
    _add_localcluster(sub)
    _add_node(sub)
    cliargs.set_progs(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # named under the subcommand they were given to, not under ``kubegpu``
            prog = getattr(args, "command_prog", parser.prog)
            words = cliargs.one_line(" ".join(extra))
            parser.exit(cliargs.EXIT_USAGE, f"{prog}: unrecognized arguments: {words} (see {prog} --help)\n")
    except SystemExit as done:  # a usage error (its one line is on stderr), --help or --version
        return int(done.code or 0) if not isinstance(done.code, str) else cliargs.EXIT_USAGE
    logs.configure(args.log_level)
    return cliargs.run_command(args.command_prog, lambda: args.run(args), debug=args.log_level == "debug")


if __name__ == "__main__":
    sys.exit(main())
