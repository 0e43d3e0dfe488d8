"""Build the node agent's parts from command-line options: plugins, rewriter, advertiser, metrics."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from kubernetes import client

from crishim.advertiser import Advertiser
from crishim.gpumetrics import GpuTelemetrySampler
from crishim.metricspublisher import MetricsPublisher, PublishPolicy
from crishim.mps import build_sharing
from crishim.nrtpublisher import TopologyPublisher
from crishim.podlookup import ApiPodLookup, NodePodCache
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.model import DeviceKind
from devices.plugin import PluginError
from devices.registry import load_plugins
from kubegpu import nrt
from kubegpu.allocation import KeyRing
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim")


def node_devices_from(args: argparse.Namespace) -> NodeDevices:
    """Load the plugins named on the command line and discover.

    A discovery failure is logged, not fatal: the shim serves kubelet (pods without devices run;
    device-bearing creates get UNAVAILABLE) and retries discovery in the background.
    """
    options = {
        "node_name": args.node_name,
        "topology": args.sim_topology,
        "state_dir": args.sim_state_dir,
        "sysfs_root": args.sysfs_root,
    }
    plugins = load_plugins(args.device_plugin, options)
    # GPU shares are enforced through MPS where the control binary is; the NVIDIA plugin (if loaded)
    # puts each shared GPU in EXCLUSIVE_PROCESS compute mode while its daemon runs.
    exclusive = [getattr(p, "set_exclusive_compute", None) for p in plugins]
    compute_mode = next((hook for hook in exclusive if hook is not None), None)
    sharing = build_sharing(
        args.mps_control,
        args.mps_dir,
        compute_mode if args.mps_compute_mode == "exclusive" else None,
        node=args.node_name,
    )
    node_devices = NodeDevices(plugins, sysfs_root=args.sysfs_root, sharing=sharing)
    try:
        node_devices.discover()
    except PluginError as error:
        # Keep serving kubelet: pods without devices still run; allocated ones are refused.
        log_event(log, "devices.discovery_failed", logging.ERROR, node=args.node_name, error=str(error))
        return node_devices
    log_event(
        log,
        "devices.discovered",
        node=args.node_name,
        plugins=args.device_plugin,
        devices=sorted(node_devices.devices),
    )
    return node_devices


def build_rewriter(
    args: argparse.Namespace, node_devices: NodeDevices, api: client.ApiClient | None
) -> AllocationRewriter:
    """The shim's interceptor; the API (if any) serves pods whose sandbox lacks the allocation, and
    every allocated pod's request of ``kubegpu.io/rdma``, from a watch of this node's pods
    (``--pod-cache``, started here) or a read of the pod."""
    lookup = None
    if api is not None:
        core = client.CoreV1Api(api)
        cache = NodePodCache(core, args.node_name).start() if getattr(args, "pod_cache", False) else None
        lookup = ApiPodLookup(core, cache=cache)
    return AllocationRewriter(
        args.node_name,
        node_devices,
        KeyRing(Path(args.allocation_keys_dir)),
        lookup,
        sys_admin_namespaces=frozenset(getattr(args, "allow_sys_admin_namespace", None) or ()),
        rdma_resource=lookup.rdma_resource if lookup is not None else None,
    )


def build_telemetry(
    args: argparse.Namespace, node_devices: NodeDevices, rewriter: AllocationRewriter
) -> GpuTelemetrySampler | None:
    """The per-GPU metrics sampler (``--telemetry-interval``; None when it is 0)."""
    if not getattr(args, "telemetry_interval", 0):
        return None
    return GpuTelemetrySampler(
        args.node_name,
        node_devices.plugins,
        gpus=lambda: node_devices.inventory.by_kind(DeviceKind.GPU),
        holdings=rewriter.ledger.holdings,
        interval=args.telemetry_interval,
    )


def build_advertiser(
    args: argparse.Namespace, node_devices: NodeDevices, api: client.ApiClient
) -> Advertiser:
    return Advertiser(
        client.CoreV1Api(api),
        args.node_name,
        node_devices.current_inventory,
        interval=args.advertise_interval,
        heartbeat_seconds=args.heartbeat_interval,
    )


def build_metrics_publisher(
    args: argparse.Namespace, telemetry: GpuTelemetrySampler | None, api: client.ApiClient
) -> MetricsPublisher | None:
    """The NodeGpuMetric publisher (``--metrics-publish-*``); None when the sampler is off
    (``--telemetry-interval 0``) or ``--metrics-publish-interval`` is 0."""
    interval = getattr(args, "metrics_publish_interval", 0)
    if telemetry is None or not interval:
        return None
    policy = PublishPolicy(
        interval=interval,
        refresh=args.metrics_publish_refresh,
        utilization_points=args.metrics_utilization_threshold,
        memory_percent=args.metrics_memory_threshold,
    )
    return MetricsPublisher(
        client.CustomObjectsApi(api),
        client.CoreV1Api(api),
        args.node_name,
        rows=lambda: telemetry.rows,
        sampled_at=lambda: telemetry.sampled_at,
        policy=policy,
    )


def build_nrt_publisher(
    args: argparse.Namespace, node_devices: NodeDevices, rewriter: AllocationRewriter, api: client.ApiClient
) -> TopologyPublisher | None:
    """The NodeResourceTopology publisher (``--nrt-*``, docs/nrt.md); None when
    ``--nrt-publish-interval`` is 0."""
    interval = getattr(args, "nrt_publish_interval", 0)
    if not interval:
        return None
    sysfs_root = args.sysfs_root
    return TopologyPublisher(
        client.CustomObjectsApi(api),
        client.CoreV1Api(api),
        args.node_name,
        inventory=node_devices.current_inventory,
        held=lambda: {h.device for h in rewriter.ledger.holdings()},
        numa_nodes=lambda: nrt.read_numa_nodes(sysfs_root),
        interval=interval,
        refresh=max(300.0, interval),
        host_resources=args.nrt_host_resources,
        policy=args.nrt_topology_manager_policy,
        scope=args.nrt_topology_manager_scope,
    )
