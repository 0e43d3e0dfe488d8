"""kubelet for a local-cluster node: its configuration, certificates and process.

kubelet authenticates with a node client certificate (``system:node:<name>``, group
``system:nodes``), so the apiserver's Node authorizer and NodeRestriction admission give it the
rights of a real node, and it serves its API (logs, exec, attach, port-forward) on the node IP with
a CA-signed certificate that the apiserver verifies. It runs inside the node's mount namespace
(namespace.py) and talks CRI to whatever endpoint the node gives it: the kubegpu shim, containerd
directly, or a peer proxy.

The configuration is what these machines need (cgroup v1 VMs, no swap accounting, no kube-proxy):
``failCgroupV1: false``, ``cgroupDriver: cgroupfs``, ``cgroupsPerQOS: false``,
``enforceNodeAllocatable: []``, ``failSwapOn: false``, ``makeIPTablesUtilChains: false`` (kubelet
would otherwise add iptables chains to the host), image garbage collection off (the images are
imported, never pulled), eviction thresholds low (a shared test machine must not evict test pods),
a 5 s crash-loop back-off cap so that restarts show quickly, and the FlexVolume directory under
the node's own directory (kubelet creates it, and its default is a host path under /usr).
"""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubegpu.devenv.controlplane import (
    PORT_ATTEMPTS,
    Component,
    ControlPlane,
    ControlPlaneError,
    free_ports,
    http_ok,
)

SIOCGIFADDR = 0x8915
NODES_GROUP = "system:nodes"


class KubeletError(RuntimeError):
    """kubelet could not be configured or started."""


def default_route_interface(route_table: Path = Path("/proc/net/route")) -> str:
    """Name of the interface of the IPv4 default route."""
    for line in route_table.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    raise KubeletError("no IPv4 default route: the node needs a non-loopback address")


def interface_address(interface: str) -> str:
    """The IPv4 address of ``interface``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError as exc:
            raise KubeletError(f"interface {interface} has no IPv4 address: {exc}") from exc
    return socket.inet_ntoa(packed[20:24])


def node_ip() -> str:
    """The node IP: the default-route interface's address (kubelet refuses loopback)."""
    return interface_address(default_route_interface())


def kubelet_config(
    *,
    address: str,
    port: int,
    healthz_port: int,
    runtime_endpoint: str,
    client_ca: Path,
    tls_cert: Path,
    tls_key: Path,
    volume_plugin_dir: Path,
    max_pods: int = 110,
) -> dict[str, Any]:
    """A KubeletConfiguration (v1beta1) for a local-cluster node. ``volume_plugin_dir``: where
    kubelet looks for (and creates) its FlexVolume directory; its default,
    /usr/libexec/kubernetes/kubelet-plugins/volume/exec, is outside the node's private dirs."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(tls_cert),
        "tlsPrivateKeyFile": str(tls_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": runtime_endpoint,
        "imageServiceEndpoint": runtime_endpoint,
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "maxPods": max_pods,
        "volumePluginDir": str(volume_plugin_dir),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "crashLoopBackOff": {"maxContainerRestartPeriod": "5s"},
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
        "registerNode": True,
    }


@dataclass
class Kubelet:
    """One kubelet process for node ``name``, files under ``directory``."""

    name: str
    directory: Path
    binary: Path
    plane: ControlPlane
    runtime_endpoint: str
    address: str
    # Put before the command: the node namespace's ``nsenter``.
    enter: Callable[[list[str]], list[str]]
    max_pods: int = 110
    extra_args: Sequence[str] = ()
    component: Component | None = None
    port: int = 0
    healthz_port: int = 0

    @property
    def kubeconfig(self) -> Path:
        return self.plane.run_dir / f"node-{self.name}.kubeconfig"

    @property
    def config_path(self) -> Path:
        return self.directory / "kubelet-config.yaml"

    @property
    def log_path(self) -> Path:
        return self.directory / "kubelet.log"

    def configure(self) -> None:
        """Issue the node's client and serving certificates and write kubeconfig and config."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.plane.client_cert_kubeconfig(f"node-{self.name}", f"system:node:{self.name}", (NODES_GROUP,))
        cert, key = self.plane.pki.issue(
            f"kubelet-serving-{self.name}",
            f"/CN=system:node:{self.name}/O={NODES_GROUP}",
            server=True,
            alt_names=(f"IP:{self.address}", f"DNS:{self.name}"),
        )
        self.port, self.healthz_port = free_ports(2)
        config = kubelet_config(
            address=self.address,
            port=self.port,
            healthz_port=self.healthz_port,
            runtime_endpoint=self.runtime_endpoint,
            client_ca=self.plane.pki.ca_cert,
            tls_cert=cert,
            tls_key=key,
            volume_plugin_dir=self.directory / "volume-plugins",
            max_pods=self.max_pods,
        )
        self.config_path.write_text(yaml.safe_dump(config))

    def command(self) -> list[str]:
        return self.enter([
            str(self.binary),
            f"--config={self.config_path}",
            f"--kubeconfig={self.kubeconfig}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.address}",
            *self.extra_args,
        ])

    def start(self, timeout: float = 60.0) -> Kubelet:
        """Start kubelet (configuring it first if needed) and wait for its /healthz.

        Its ports were free when picked; if another process took one meanwhile, kubelet is
        configured with new ports and started again (3 attempts).
        """
        if not self.config_path.exists():
            self.configure()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.component = Component("kubelet", self.command(), self.log_path).start()
            try:
                self.component.wait_until(
                    lambda: http_ok(f"http://127.0.0.1:{self.healthz_port}/healthz"), "healthy", timeout
                )
                return self
            except ControlPlaneError as exc:
                if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                    raise
                self.component.stop()
                self.configure()
        raise AssertionError("unreachable")

    def alive(self) -> bool:
        return self.component is not None and self.component.alive()

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()

    def restart(self, timeout: float = 60.0) -> None:
        """Stop kubelet (SIGTERM: pods keep running) and start it again with the same config."""
        self.stop()
        self.start(timeout)

    def tail(self, lines: int = 50) -> str:
        return self.component.tail(lines) if self.component else "(kubelet not started)"
