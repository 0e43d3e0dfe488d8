"""Build the shim's AllocationRewriter from command-line options (plugins, keys, API fallback)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from crishim.podlookup import ApiPodLookup
from crishim.rewrite import AllocationRewriter, KeyRing, NodeDevices, PodAnnotationLookup
from devices.plugin import PluginError, load_plugins
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim")


def api_lookup(kubeconfig: str | None) -> PodAnnotationLookup | None:
    """The API fallback, from a kubeconfig or the in-cluster service account; None without either."""
    from kubernetes import client, config

    if kubeconfig:
        api = config.new_client_from_config(config_file=kubeconfig)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        api = client.ApiClient()
    else:
        return None
    return ApiPodLookup(client.CoreV1Api(api))


def build_rewriter(args: argparse.Namespace) -> AllocationRewriter:
    """Load plugins and discover devices now; a discovery failure is logged, not fatal."""
    options = {
        "node_name": args.node_name,
        "topology": args.sim_topology,
        "state_dir": args.sim_state_dir,
        "sysfs_root": args.sysfs_root,
    }
    plugins = load_plugins(args.device_plugin, options)
    node_devices = NodeDevices(plugins, sysfs_root=args.sysfs_root)
    try:
        node_devices.discover()
    except PluginError as error:
        # Keep serving kubelet: pods without devices still run; allocated ones are refused.
        log_event(log, "devices.discovery_failed", logging.ERROR, node=args.node_name, error=str(error))
    log_event(log, "devices.discovered", node=args.node_name, plugins=args.device_plugin,
              devices=sorted(node_devices.devices))
    return AllocationRewriter(args.node_name, node_devices, KeyRing(Path(args.allocation_keys_dir)),
                              api_lookup(args.kubeconfig))
