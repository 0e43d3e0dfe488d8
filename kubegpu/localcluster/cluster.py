"""The local cluster: control plane, kube-controller-manager, the kubegpu scheduler and GPU nodes.

Everything lives under one state directory::

    <state>/cluster.json          what runs (process records, node namespaces, containerd dirs)
    <state>/control-plane/        PKI, kubeconfigs (admin.kubeconfig), etcd data, component logs
    <state>/keys/scheduler|node/  the allocation signing keys (scheduler side, node side)
    <state>/scheduler.yaml, scheduler.log
    <state>/nodes/<name>/         one node (node.py): its namespace dirs, containerd, shim, kubelet

The apiserver runs ``--authorization-mode=Node,RBAC`` with NodeRestriction; kubelets use node
certificates; the kubegpu scheduler and the node agents use the ``kubegpu-scheduler`` and
``kubegpu-node`` ServiceAccounts and RBAC of ``deploy/`` (10-scheduler-rbac.yaml,
11-node-rbac.yaml), so every component runs with the rights it has in a real cluster. Both
PodGroup APIs are served: scheduler-plugins' CRD (deploy/crds/) and Kubernetes' own
(``scheduling.k8s.io/v1beta1``, ``GenericWorkload`` gate on).

``LocalCluster.stop()`` stops what this process started. ``teardown(state_dir)`` stops a cluster
from its ``cluster.json`` alone (``kubegpu down``, from another process). Both end with the
sweep (processes.py) and return the leftovers they found afterwards: none when all went well.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kubernetes import client as k8s

from kubegpu.allocation import VerifyingKey, load_keys, private_key_pem, public_key_pem
from kubegpu.devenv.containerd import Containerd, ContainerdError
from kubegpu.devenv.controlplane import (
    POD_GROUP_API_ARGS,
    REPO_ROOT,
    Binaries,
    BinariesMissing,
    Component,
    ControlPlane,
    free_ports,
    http_ok,
    testbin_dir,
)
from kubegpu.devenv.manifests import apply_manifests
from kubegpu.localcluster.kubelet import node_ip
from kubegpu.localcluster.namespace import read_tunables, restore_tunables
from kubegpu.localcluster.node import ADVERTISE_INTERVAL_SECONDS, LocalNode, PeerProxy
from kubegpu.localcluster.processes import (
    ProcessRecord,
    mounts_under,
    processes_of,
    remove_cgroups,
    remove_runtime_remains,
    runtime_remains,
    sweep,
)

STATE_FILE = "cluster.json"
# Marks a directory as a local cluster's state dir: only such a dir is ever emptied.
MARKER = ".kubegpu-cluster"
STATE_VERSION = 1
SYSTEM_NAMESPACE = "kubegpu-system"
SCHEDULER_ACCOUNT = "kubegpu-scheduler"
NODE_ACCOUNT = "kubegpu-node"
KUBEGPU_AGENTS = ("kubegpu", "kubegpu-nri")  # node proxies that run the kubegpu node agent
DEPLOY_RBAC = ("00-namespace.yaml", "10-scheduler-rbac.yaml", "11-node-rbac.yaml")
# Gang scheduling (docs/gang.md): scheduler-plugins' PodGroup CRD, and Kubernetes' own PodGroup API
# (beta in v1.37, behind the GenericWorkload gate), so both kinds of group work on the local cluster.
DEPLOY_CRDS = REPO_ROOT / "deploy" / "crds"
KEY_ID = "k1"
# ServiceAccount tokens of the scheduler and node agents last as long as the cluster's certificates.
TOKEN_SECONDS = 7 * 24 * 3600
GPU_RESOURCE = "nvidia.com/gpu"
INVENTORY_ANNOTATION = "kubegpu.io/inventory"
# Unix socket paths are limited to 107 bytes; containerd adds ".ttrpc" to its socket.
MAX_SOCKET_PATH = 100
# kubelet's fixed paths are private to a node's namespace: a state dir under them would vanish there.
FORBIDDEN_STATE_PARENTS = (Path("/var/lib"), Path("/var/log"))


class LocalClusterError(RuntimeError):
    """The local cluster could not be started, found or stopped."""


@dataclass(frozen=True)
class ClusterBinaries:
    """Every Kubernetes executable the local cluster runs (the testbin cache)."""

    apiserver: Path
    etcd: Path
    controller_manager: Path
    kubelet: Path
    kubectl: Path

    def control_plane(self) -> Binaries:
        return Binaries(apiserver=self.apiserver, scheduler=self.apiserver.with_name("kube-scheduler"),
                        etcd=self.etcd)


def find_cluster_binaries(directory: Path | None = None) -> ClusterBinaries:
    """The binaries in ``directory`` (default: the testbin directory), or raise BinariesMissing."""
    directory = directory or testbin_dir()
    found = ClusterBinaries(
        apiserver=directory / "kube-apiserver",
        etcd=directory / "etcd",
        controller_manager=directory / "kube-controller-manager",
        kubelet=directory / "kubelet",
        kubectl=directory / "kubectl",
    )
    missing = [p.name for p in vars(found).values() if not os.access(p, os.X_OK)]
    if missing:
        raise BinariesMissing(
            f"{', '.join(missing)} not found in {directory}; run `make testbin` "
            "(tests/cluster/build.sh) to build them"
        )
    return found


def check_state_dir(state_dir: Path) -> Path:
    """The absolute state dir, or LocalClusterError when a node could not use it."""
    state_dir = state_dir.absolute()
    for parent in FORBIDDEN_STATE_PARENTS:
        if state_dir == parent or parent in state_dir.parents:
            raise LocalClusterError(
                f"state dir {state_dir} is under {parent}, which is private inside a node; pick another"
            )
    longest = state_dir / "nodes" / ("n" * 24) / "containerd" / "containerd.sock"
    if len(str(longest)) > MAX_SOCKET_PATH:
        raise LocalClusterError(f"state dir {state_dir} is too long for the unix sockets under it")
    return state_dir


def write_allocation_keys(scheduler_dir: Path, node_dir: Path) -> str:
    """Make the cluster's Ed25519 allocation key; return its key id.

    The scheduler signs with the private key in ``scheduler_dir``; nodes hold only the public key,
    in ``node_dir`` (the file formats of docs/allocation.md).
    """
    key = Ed25519PrivateKey.generate()
    for directory, data in ((scheduler_dir, private_key_pem(key)), (node_dir, public_key_pem(key))):
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        path = directory / KEY_ID
        path.write_bytes(data)
        path.chmod(0o400)
    return KEY_ID


def verifying_keys(node_keys: Path) -> Mapping[str, VerifyingKey]:
    """The keys a node verifies allocations with (what ``kubegpu.allocation.verify`` takes)."""
    return load_keys(node_keys).public


def node_ready(node: k8s.V1Node) -> bool:
    for condition in (node.status.conditions if node.status else None) or []:
        if condition.type == "Ready":
            return bool(condition.status == "True")
    return False


def blocking_taints(node: k8s.V1Node) -> list[str]:
    """Taints that keep ordinary pods off the node (the node lifecycle controller lifts the
    not-ready one a moment after the node turns Ready)."""
    return [t.key for t in (node.spec.taints if node.spec else None) or []
            if t.effect in ("NoSchedule", "NoExecute")]


@dataclass
class LocalCluster:
    """A local cluster under ``state_dir``. Start it, add nodes, stop it."""

    state_dir: Path
    binaries: ClusterBinaries = field(default_factory=find_cluster_binaries)
    scheduler_name: str = "kubegpu"
    scheduler_policy: str = "topology"
    plane: ControlPlane | None = None
    manager: Component | None = None
    scheduler: Component | None = None
    scheduler_metrics_port: int = 0
    nodes: dict[str, LocalNode] = field(default_factory=dict)
    address: str = ""
    key_id: str = KEY_ID
    _started: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.state_dir = check_state_dir(Path(self.state_dir))

    # ---- paths

    @property
    def admin_kubeconfig(self) -> Path:
        assert self.plane is not None
        return self.plane.admin_kubeconfig

    @property
    def kubectl(self) -> Path:
        return self.binaries.kubectl

    @property
    def scheduler_keys(self) -> Path:
        return self.state_dir / "keys" / "scheduler"

    @property
    def node_keys(self) -> Path:
        return self.state_dir / "keys" / "node"

    def admin_client(self) -> k8s.ApiClient:
        assert self.plane is not None
        return self.plane.admin_client()

    # ---- start

    def start(self, progress: Callable[[str], None] = lambda _: None) -> LocalCluster:
        """Start etcd, kube-apiserver, kube-controller-manager and the kubegpu scheduler."""
        if (self.state_dir / STATE_FILE).exists():
            raise LocalClusterError(
                f"a local cluster is already recorded in {self.state_dir} (kubegpu down --state-dir ...)"
            )
        running = processes_of(self.state_dir)
        if running:
            raise LocalClusterError(
                f"processes of an earlier cluster still use {self.state_dir}: pids {sorted(running)}"
            )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        entries = {entry.name for entry in self.state_dir.iterdir()}
        if entries - {"logs", MARKER} and MARKER not in entries:
            raise LocalClusterError(f"{self.state_dir} is not empty and not a kubegpu state dir; "
                                    "pick an empty or new directory")
        (self.state_dir / MARKER).touch()
        for stale in self.state_dir.iterdir():  # what a crashed run left; nothing uses it
            if stale.name in ("logs", MARKER):
                continue
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        self._started = True
        self.address = node_ip()
        try:
            progress("etcd and kube-apiserver")
            self.plane = ControlPlane(
                run_dir=self.state_dir / "control-plane",
                binaries=self.binaries.control_plane(),
                apiserver_extra_args=POD_GROUP_API_ARGS,
            ).start()
            self.save_state()
            progress("kube-controller-manager")
            self.manager = self.plane.start_controller_manager(self.binaries.controller_manager)
            self.save_state()
            progress("RBAC, ServiceAccounts and allocation keys")
            with self.admin_client() as admin:
                apply_manifests(admin, [REPO_ROOT / "deploy" / name for name in DEPLOY_RBAC])
                apply_manifests(admin, [DEPLOY_CRDS])
            self.key_id = write_allocation_keys(self.scheduler_keys, self.node_keys)
            progress("kubegpu scheduler")
            self.start_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def _account_kubeconfig(self, account: str) -> Path:
        assert self.plane is not None
        return self.plane.service_account_kubeconfig(SYSTEM_NAMESPACE, account, TOKEN_SECONDS)

    def start_scheduler(self, timeout: float = 60.0) -> Component:
        """Start (or start again) ``kubegpu scheduler`` as the kubegpu-scheduler ServiceAccount."""
        assert self.plane is not None
        kubeconfig = self._account_kubeconfig(SCHEDULER_ACCOUNT)
        (self.scheduler_metrics_port,) = free_ports(1)
        config = {
            "schedulerName": self.scheduler_name,
            "signingKeyId": self.key_id,
            "keysDir": str(self.scheduler_keys),
            "policy": self.scheduler_policy,
            "metricsAddress": f"127.0.0.1:{self.scheduler_metrics_port}",
        }
        config_path = self.state_dir / "scheduler.yaml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "kubegpu", "scheduler", "--config", str(config_path),
                "--kubeconfig", str(kubeconfig)]
        self.scheduler = Component("kubegpu-scheduler", argv, self.state_dir / "scheduler.log").start()
        port = self.scheduler_metrics_port
        self.scheduler.wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), "ready", timeout)
        self.save_state()
        return self.scheduler

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.save_state()

    def restart_scheduler(self) -> None:
        self.stop_scheduler()
        self.start_scheduler()

    # ---- nodes

    def add_node(
        self,
        name: str | None = None,
        containerd_bin_dir: Path | None = None,
        proxy: str | PeerProxy = "kubegpu",
        topology: str = "dgx1-v100",
        max_pods: int = 110,
        advertise_interval: float = ADVERTISE_INTERVAL_SECONDS,
        node_agent_api: bool = True,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> LocalNode:
        """Start a node (namespace, containerd, proxy, kubelet) and wait until it is usable.

        With ``proxy="kubegpu"`` usable means Ready and advertising its GPUs; otherwise Ready.
        ``node_agent_api=False`` gives the shim no API access: no advertiser, no pod lookups
        (bench/node_overhead.py measures what those cost; the scheduler cannot use such a node).
        """
        assert self.plane is not None
        name = name or f"kubegpu-node-{uuid.uuid4().hex[:6]}"
        if name in self.nodes:
            raise LocalClusterError(f"node {name} already exists")
        node = LocalNode(
            name=name,
            directory=self.state_dir / "nodes" / name,
            plane=self.plane,
            kubelet_binary=self.binaries.kubelet,
            address=self.address,
            containerd_bin_dir=containerd_bin_dir,
            proxy=proxy,
            topology=topology,
            agent_kubeconfig=(self._account_kubeconfig(NODE_ACCOUNT)
                              if proxy in KUBEGPU_AGENTS and node_agent_api else None),
            keys_dir=self.node_keys if proxy in KUBEGPU_AGENTS else None,
            max_pods=max_pods,
            advertise_interval=advertise_interval,
        )
        self.nodes[name] = node
        try:
            node.start()
        finally:
            self.save_state()
        if wait:
            self.wait_node_usable(node, timeout)
        return node

    def wait_node_usable(self, node: LocalNode, timeout: float = 120.0) -> k8s.V1Node:
        """Block until ``node`` is Ready (and, behind the kubegpu shim, advertises its GPUs)."""
        deadline = time.monotonic() + timeout
        last: k8s.V1Node | None = None
        with self.admin_client() as admin:
            core = k8s.CoreV1Api(admin)
            while time.monotonic() < deadline:
                if node.kubelet is not None and not node.kubelet.alive():
                    raise LocalClusterError(f"kubelet of {node.name} exited:\n{node.kubelet.tail()}")
                try:
                    last = core.read_node(node.name)
                except k8s.ApiException as exc:
                    if exc.status != 404:
                        raise
                    last = None
                if last is not None and node_ready(last) and not blocking_taints(last) \
                        and self._advertised(node, last):
                    return last
                time.sleep(0.5)
        kubelet_log = node.kubelet.tail(30) if node.kubelet else ""
        raise LocalClusterError(
            f"node {node.name} not usable after {timeout}s (last seen: "
            f"{last.status.conditions if last and last.status else None})\n{kubelet_log}"
        )

    @staticmethod
    def _advertised(node: LocalNode, seen: k8s.V1Node) -> bool:
        if node.proxy not in KUBEGPU_AGENTS or node.agent_kubeconfig is None:
            return True
        capacity = (seen.status.capacity if seen.status else None) or {}
        annotations = seen.metadata.annotations or {}
        return INVENTORY_ANNOTATION in annotations and capacity.get(GPU_RESOURCE, "0") != "0"

    def remove_node(self, name: str) -> None:
        """Stop a node, delete its Node object and its files."""
        node = self.nodes.pop(name)
        node.stop()
        node.remove_files()
        with self.admin_client() as admin:
            try:
                k8s.CoreV1Api(admin).delete_node(name)
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
        self.save_state()

    # ---- state file

    def records(self) -> list[ProcessRecord]:
        """Every live daemon, in start order."""
        records = []
        if self.plane is not None:
            for component in self.plane.components:
                if component.alive() and component.process is not None:
                    records.append(ProcessRecord.of(component.name, component.process.pid))
        for node in self.nodes.values():
            records.extend(node.records())
        if self.scheduler is not None and self.scheduler.alive() and self.scheduler.process is not None:
            records.append(ProcessRecord.of("kubegpu-scheduler", self.scheduler.process.pid))
        return records

    def state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "stateDir": str(self.state_dir),
            "adminKubeconfig": str(self.admin_kubeconfig) if self.plane else None,
            "kubectl": str(self.binaries.kubectl),
            "schedulerName": self.scheduler_name,
            "processes": [record.as_dict() for record in self.records()],
            "nodes": [
                {
                    "name": node.name,
                    "containerdBase": str(node.containerd.base) if node.containerd else None,
                    "containerdBinDir": str(node.containerd_bin_dir) if node.containerd_bin_dir else None,
                    "namespace": node.namespace.namespace_id if node.namespace else None,
                    "tunables": node.namespace.saved_tunables if node.namespace else {},
                    "cgroupParents": node.cgroup_parents,
                }
                for node in self.nodes.values()
            ],
        }

    def save_state(self) -> None:
        """Write cluster.json (atomically) so that ``teardown`` can stop this cluster from anywhere."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / STATE_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.state(), indent=1))
        temporary.replace(path)

    # ---- stop

    def stop(self) -> list[str]:
        """Stop everything this process started; return the leftovers found afterwards.

        A cluster whose ``start`` refused (another cluster owns the state dir) stops nothing.
        """
        if not self._started:
            return []
        namespaces = [n.namespace.namespace_id for n in self.nodes.values()
                      if n.namespace is not None and n.namespace.namespace_id]
        tunables = {}
        if self.scheduler is not None:
            self.scheduler.stop()
        for node in reversed(list(self.nodes.values())):
            if node.namespace is not None:
                tunables.update(node.namespace.saved_tunables)
            node.stop()
        if self.plane is not None:
            self.plane.stop()  # the controller manager is one of its components
        sweep(self.state_dir, namespaces)
        restore_tunables(tunables)
        containerd_states = [n.containerd.base / "state" for n in self.nodes.values() if n.containerd]
        found = leftovers(self.state_dir, namespaces, tunables, containerd_states)
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        return found


# --------------------------------------------------------------------------- teardown by state


def load_state(state_dir: Path) -> dict[str, Any]:
    path = state_dir / STATE_FILE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise LocalClusterError(f"no local cluster recorded in {state_dir} ({STATE_FILE} missing)") from None
    except (OSError, ValueError) as exc:
        raise LocalClusterError(f"cannot read {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise LocalClusterError(f"{path} is not a version-{STATE_VERSION} local cluster record")
    return state


def leftovers(state_dir: Path, namespaces: Iterable[str], tunables: dict[str, str],
              containerd_states: Iterable[Path] = ()) -> list[str]:
    """What a stopped cluster left behind: processes, mounts, changed kernel tunables, and what
    the runc shims of its containerds keep on the host (runc state, shim sockets, cgroups)."""
    found = []
    for pid in sorted(processes_of(state_dir, namespaces)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append(f"process {pid}: {cmdline.strip()[:200]}")
    found += [f"mount {point}" for point in mounts_under(state_dir)]
    now = read_tunables(tuple(tunables))
    found += [f"sysctl {name} is {now[name]}, was {value}" for name, value in tunables.items()
              if name in now and now[name] != value]
    found += [f"runtime file {path}" for state in containerd_states for path in runtime_remains(state)]
    return found


def collect_logs(state_dir: Path, into: str = "logs") -> Path:
    """Copy every ``*.log`` under the state dir to ``<state>/logs/`` (path separators become ``_``)."""
    target = state_dir / into
    target.mkdir(exist_ok=True)
    for path in state_dir.rglob("*.log"):
        if target in path.parents or not path.is_file():
            continue
        shutil.copyfile(path, target / "_".join(path.relative_to(state_dir).parts))
    return target


def teardown(state_dir: Path, remove_files: bool = True, keep: Iterable[str] = ("logs",)) -> list[str]:
    """Stop the cluster recorded in ``state_dir`` and return the leftovers (none on success).

    Order: the scheduler and kubelets first (nothing restarts containers any more), then every
    container through containerd, then the other daemons newest first, then the sweep. With
    ``remove_files`` the state dir is emptied except the names in ``keep``.
    """
    state = load_state(state_dir)
    records = [ProcessRecord.from_dict(doc) for doc in state.get("processes", [])]
    first = [r for r in records if r.name == "kubegpu-scheduler" or r.name.endswith("/kubelet")]
    for record in first:
        record.stop()
    for node in state.get("nodes", []):
        base = node.get("containerdBase")
        if not base:
            continue
        bin_dir = Path(node["containerdBinDir"]) if node.get("containerdBinDir") else None
        try:
            Containerd(base=Path(base), bin_dir=bin_dir).kill_all_tasks()
        except (ContainerdError, OSError):
            pass
    for record in reversed(records):
        if record not in first:
            record.stop()
    namespaces = [n["namespace"] for n in state.get("nodes", []) if n.get("namespace")]
    tunables: dict[str, str] = {}
    for node in state.get("nodes", []):
        tunables.update(node.get("tunables") or {})
    sweep(state_dir, namespaces)
    restore_tunables(tunables)
    containerd_states = [Path(n["containerdBase"]) / "state" for n in state.get("nodes", [])
                         if n.get("containerdBase")]
    for containerd_state in containerd_states:  # a killed containerd's runc shims left these
        remove_runtime_remains(containerd_state)
    remove_cgroups([path for node in state.get("nodes", []) for path in node.get("cgroupParents", [])])
    found = leftovers(state_dir, namespaces, tunables, containerd_states)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    if remove_files and not found and (state_dir / MARKER).exists():
        collect_logs(state_dir)
        kept = set(keep) | {MARKER}
        for entry in state_dir.iterdir():
            if entry.name in kept:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    return found
