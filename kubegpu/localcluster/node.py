"""One node of the local cluster: containerd, a CRI proxy in front of it, and kubelet.

Everything runs inside the node's private mount namespace (namespace.py) under the node's
directory. kubelet's ``--container-runtime-endpoint`` is, by ``proxy``:

* ``"kubegpu"``: ``kubegpu crishim`` with the sim device plugin (a shipped topology, 8 simulated
  DGX-1 V100 GPUs by default) and its advertiser publishing the node's devices, the product as a
  GPU node runs it;
* ``"kubegpu-nri"``: containerd itself, with ``kubegpu crishim --front nri`` registered as its
  required NRI plugin (containerd 2.x only; docs/nri.md): the same agent, nothing on kubelet's
  call path;
* ``"none"``: containerd itself (the baseline of bench/node_overhead.py);
* a ``PeerProxy``: another CRI proxy, started from a command line (bench/node_overhead.py).

containerd is Debian's (``containerd_bin_dir=None``) or a Go-built 2.x (its testbin directory),
with a loopback-only CNI config from Debian's containernetworking-plugins so that the Node turns
Ready; pods use the host network. The restart helpers (kubelet, shim SIGKILL, containerd) are what
the end-to-end tests and the soak use to disturb a running node.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from crishim.cri import api_pb2
from kubegpu.devenv.containerd import Containerd
from kubegpu.devenv.controlplane import Component, ControlPlane
from kubegpu.devenv.cri import CriClient
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args
from kubegpu.localcluster.kubelet import Kubelet
from kubegpu.localcluster.namespace import MountNamespace
from kubegpu.localcluster.processes import (
    ProcessRecord,
    absent_cgroup_parents,
    remove_cgroups,
    remove_runtime_remains,
    sweep,
)

CNI_PLUGIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
# The local cluster publishes device changes within 2 s (production default: 10 s).
ADVERTISE_INTERVAL_SECONDS = 2.0


class NodeError(RuntimeError):
    """A node component could not be started."""


def cni_plugin_dir() -> Path:
    """Where the loopback CNI plugin is (Debian's containernetworking-plugins: /usr/lib/cni)."""
    for directory in CNI_PLUGIN_DIRS:
        if (directory / "loopback").is_file():
            return directory
    raise NodeError("no loopback CNI plugin (apt-get install containernetworking-plugins)")


NRI_FRONT = "kubegpu-nri"  # the node agent as containerd's NRI plugin instead of a CRI proxy
NRI_PLUGIN = "kubegpu"


@dataclass(frozen=True)
class PeerProxy:
    """Another CRI proxy: ``command(listen_socket, runtime_endpoint)`` gives its command line."""

    name: str
    command: Callable[[Path, str], list[str]]


@dataclass
class LocalNode:
    """A node named ``name`` whose files all live under ``directory``."""

    name: str
    directory: Path
    plane: ControlPlane
    kubelet_binary: Path
    address: str
    containerd_bin_dir: Path | None = None  # None: Debian's containerd from PATH
    proxy: str | PeerProxy = "kubegpu"
    topology: str = "dgx1-v100"
    agent_kubeconfig: Path | None = None  # the node agent's API identity (advertiser, lookups)
    keys_dir: Path | None = None  # allocation keys the shim accepts
    max_pods: int = 110
    advertise_interval: float = ADVERTISE_INTERVAL_SECONDS
    namespace: MountNamespace | None = None
    # containerd's cgroup parents that did not exist before this node (removed at teardown)
    cgroup_parents: list[str] = field(default_factory=list)
    containerd: Containerd | None = None
    shim: ShimProcess | None = None
    peer: Component | None = None
    kubelet: Kubelet | None = None

    # ---- paths and endpoints

    @property
    def proxy_socket(self) -> Path:
        return self.directory / "cri-proxy.sock"

    @property
    def runtime_endpoint(self) -> str:
        """The CRI endpoint kubelet uses: containerd itself without a proxy or with the NRI front."""
        if self.proxy in ("none", NRI_FRONT):
            assert self.containerd is not None
            return self.containerd.endpoint
        return f"unix://{self.proxy_socket}"

    @property
    def nri_socket(self) -> Path:
        return self.directory / "nri.sock"

    @property
    def sim_state_dir(self) -> Path:
        return self.directory / "sim"

    def _enter(self, argv: list[str]) -> list[str]:
        assert self.namespace is not None
        return self.namespace.enter(argv)

    # ---- lifecycle

    def start(self) -> LocalNode:
        """Start the namespace, containerd, the proxy and kubelet; stop what started on failure."""
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self.namespace = MountNamespace(self.directory).start()
            self.cgroup_parents = absent_cgroup_parents()
            nri = self.proxy == NRI_FRONT  # containerd requires the agent's plugin: it fails closed
            self.containerd = Containerd(
                base=self.directory / "containerd",
                bin_dir=self.containerd_bin_dir,
                command_prefix=self._enter([]),
                cni_bin_dir=cni_plugin_dir(),
                nri_socket=self.nri_socket if nri else None,
                nri_required_plugins=(NRI_PLUGIN,) if nri else (),
            ).start()
            self.start_proxy()
            self.kubelet = Kubelet(
                name=self.name,
                directory=self.directory / "kubelet",
                binary=self.kubelet_binary,
                plane=self.plane,
                runtime_endpoint=self.runtime_endpoint,
                address=self.address,
                enter=self._enter,
                max_pods=self.max_pods,
            ).start()
        except BaseException:
            self.stop()
            raise
        return self

    def start_proxy(self) -> None:
        """Start (or start again) the CRI proxy kubelet talks to; nothing for ``proxy="none"``."""
        assert self.containerd is not None
        if self.proxy == "none":
            return
        if isinstance(self.proxy, PeerProxy):
            argv = self._enter(self.proxy.command(self.proxy_socket, self.containerd.endpoint))
            self.peer = Component(self.proxy.name, argv, self.directory / f"{self.proxy.name}.log").start()
            self.peer.wait_until(self._proxy_answers, "serving CRI", 30)
            return
        if self.proxy not in ("kubegpu", NRI_FRONT):
            raise NodeError(f"unknown proxy {self.proxy!r} (kubegpu, kubegpu-nri, none or a PeerProxy)")
        args = sim_node_args(self.name, self.topology, self.sim_state_dir, self.keys_dir)
        if self.proxy == NRI_FRONT:
            args += ["--front", "nri", "--nri-socket", str(self.nri_socket), "--nri-plugin-name", NRI_PLUGIN]
        if self.agent_kubeconfig is not None:
            args += ["--kubeconfig", str(self.agent_kubeconfig), "--advertise",
                     "--advertise-interval", str(self.advertise_interval)]
        self.shim = ShimProcess(
            socket=self.proxy_socket,
            runtime_endpoint=self.containerd.endpoint,
            log_path=self.directory / "crishim.log",
            extra_args=args,
            prefix=self._enter([]),
        ).start(timeout=60)

    def _proxy_answers(self) -> bool:
        if not self.proxy_socket.exists():
            return False
        client = CriClient(f"unix://{self.proxy_socket}")
        try:
            client.runtime.Version(api_pb2.VersionRequest(), timeout=2)
            return True
        except grpc.RpcError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """Stop kubelet, every container, containerd, the proxy and the namespace; sweep the rest."""
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.containerd is not None:
            self.containerd.stop(remove_base=False)
        if self.shim is not None:
            self.shim.stop()
        if self.peer is not None:
            self.peer.stop()
        namespaces = []
        if self.namespace is not None:
            if self.namespace.namespace_id:
                namespaces.append(self.namespace.namespace_id)
            self.namespace.stop()
        sweep(self.directory, namespaces)
        if self.containerd is not None:  # what a killed containerd's runc shims kept on the host
            remove_runtime_remains(self.containerd.base / "state")
        remove_cgroups(self.cgroup_parents)

    def remove_files(self) -> None:
        """Delete the node's directory (after stop)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    # ---- disturbances (tests, soak)

    def restart_kubelet(self) -> None:
        assert self.kubelet is not None
        self.kubelet.restart()

    def kill_shim(self) -> None:
        """SIGKILL the kubegpu shim: no drain, the socket file stays behind."""
        assert self.shim is not None
        self.shim.kill()

    def restart_shim(self, kill: bool = True) -> None:
        """SIGKILL (or SIGTERM) the shim and start a new one on the same socket."""
        assert self.shim is not None
        if kill:
            self.shim.kill()
        else:
            self.shim.stop()
        self.start_proxy()

    def restart_containerd(self, timeout: float = 60.0) -> None:
        """SIGTERM containerd and start it again (containers keep running under their shims).

        Returns once containerd's CRI answers: its API serves first, and until the CRI plugin
        has loaded its state every CRI call fails with "server is not initialized yet".
        """
        assert self.containerd is not None
        self.containerd.restart()
        deadline = time.monotonic() + timeout
        client = CriClient(self.containerd.endpoint)
        try:
            while True:
                try:
                    client.runtime.Status(api_pb2.StatusRequest(), timeout=5)
                    return
                except grpc.RpcError as error:
                    if time.monotonic() > deadline:
                        raise NodeError(f"containerd of {self.name}: CRI not serving after restart: "
                                        f"{error}") from None
                    time.sleep(0.2)
        finally:
            client.close()

    # ---- records and logs

    def records(self) -> list[ProcessRecord]:
        """The node's live daemons, in start order (namespace, containerd, proxy, kubelet)."""
        records = []
        if self.namespace is not None and self.namespace.holder is not None:
            records.append(self.namespace.holder)
        handles = [
            ("containerd", self.containerd.process if self.containerd else None),
            ("crishim", self.shim.process if self.shim else None),
            ("peer-proxy", self.peer.process if self.peer else None),
            ("kubelet", self.kubelet.component.process if self.kubelet and self.kubelet.component else None),
        ]
        for name, process in handles:
            if process is not None and process.poll() is None:
                try:
                    records.append(ProcessRecord.of(f"{self.name}/{name}", process.pid))
                except ProcessLookupError:
                    pass
        return records

    def log_paths(self) -> dict[str, Path]:
        paths = {
            "containerd": self.directory / "containerd" / "containerd.log",
            "crishim": self.directory / "crishim.log",
            "kubelet": self.directory / "kubelet" / "kubelet.log",
        }
        if isinstance(self.proxy, PeerProxy):
            paths[self.proxy.name] = self.directory / f"{self.proxy.name}.log"
        return {name: path for name, path in paths.items() if path.exists()}

