"""A network lab for kubegpu-cni tests, touching none of the machine's own interfaces.

- a network namespace the test owns stands for the node's host namespace; the plugin executable
  runs inside it (``ip netns exec``), so everything it moves or renames lives there;
- interfaces in it stand for the VF netdevs and the PF netdev: ``dummy`` where the kernel has it,
  else ``ifb`` (a kernel without the dummy module, as some CI VMs); neither is a VF, so the
  bandwidth goes through ``TcApplier`` (``"bandwidth": "tc"``) unless a test wants VF rates to fail;
- a fake sysfs tree (``tests.test_devices_rdma.FakeSysfs``, plus ``net/<ifname>`` and ``virtfnN``)
  whose VFs' netdev names are those interfaces;
- pod namespaces, each its own ``ip netns``;
- with ``verbs=True``, each RDMA device also has its verbs node (``uverbs<N>``, ``UVERBS``) as a
  real character device under ``<root>/dev/infiniband``, with ``rdma_cm``, so that the shim's RDMA
  plugin reads the same machine (tests/support/rdmanode.py's device numbers; nothing opens them).

Every namespace is deleted by ``close`` (the interfaces in them go with them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.allocation import Allocation, RdmaInterface, sign
from tests.fixtures.common import missing_component
from tests.fixtures.keys import KEY, KEY_ID, write_node_keys
from tests.support.rdmanode import verbs_nodes
from tests.test_devices_rdma import ACTIVE, EDR, NIC0, NIC1, FakeSysfs

NODE = "node-a"
PF0, PF1 = "mlx5_0", "mlx5_1"
# VF RDMA name -> (its PF, its netdev in the lab's host namespace)
VFS = {
    "mlx5_2": (PF0, "vfnet0"),
    "mlx5_3": (PF0, "vfnet1"),
    "mlx5_4": (PF0, "vfnet2"),
    "mlx5_5": (PF1, "vfnet3"),
}
PF_NETDEVS = {PF0: "pfnet0", PF1: "pfnet1"}
UVERBS = {PF0: 0, PF1: 1, "mlx5_2": 2, "mlx5_3": 3, "mlx5_4": 4, "mlx5_5": 5}  # with verbs=True


def plugin_executable() -> str:
    """The installed console script (``pip install -e .`` makes it beside the interpreter)."""
    path = Path(sys.executable).parent / "kubegpu-cni"
    if not path.exists():
        missing_component(f"{path} is not installed (pip install -e .)")
    return str(path)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class CniRun:
    rc: int
    doc: dict[str, Any] | None
    stderr: str


class NetLab:
    """Namespaces, stand-in netdevs and a fake sysfs for one test (see the module docstring)."""

    def __init__(self, tmp: Path, verbs: bool = False) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            missing_component("kubegpu-cni tests need root and iproute2's ip (network namespaces)")
        self.tmp = tmp
        self.tag = uuid.uuid4().hex[:6]
        self.host = f"kgcni-h-{self.tag}"
        self.namespaces: list[str] = []
        self.exe = plugin_executable()
        self._add_netns(self.host)
        self.kind = self._link_kind()
        self.root = tmp / "root"
        self.keys = write_node_keys(tmp / "keys")
        self.state = tmp / "state"
        self.sysfs = FakeSysfs(self.root)
        self.pci: dict[str, Path] = {}
        for pf, chain in ((PF0, NIC0), (PF1, NIC1)):
            path = self.sysfs.pci(*chain, numa=0)
            self.sysfs.ib(pf, path, [(EDR, ACTIVE, "Ethernet")], uverbs=self._verbs(pf, verbs), num_vfs=3)
            self.pci[pf] = path
            self.add_netdev(PF_NETDEVS[pf], path)
        counters = {PF0: 0, PF1: 0}
        for k, (vf, (pf, netdev)) in enumerate(VFS.items()):
            path = self.sysfs.pci(*NIC0[:-1], f"0000:04:01.{k}", numa=0)
            self.sysfs.ib(
                vf, path, [(EDR, ACTIVE, "Ethernet")], uverbs=self._verbs(vf, verbs), physfn=self.pci[pf]
            )
            (self.pci[pf] / f"virtfn{counters[pf]}").symlink_to(os.path.relpath(path, self.pci[pf]))
            counters[pf] += 1
            self.pci[vf] = path
            self.add_netdev(netdev, path)
        if verbs:
            verbs_nodes(self.sysfs, UVERBS.values())

    @staticmethod
    def _verbs(device: str, verbs: bool) -> int | None:
        return UVERBS[device] if verbs else None

    # --- namespaces and links ---------------------------------------------------------------

    def _add_netns(self, name: str) -> str:
        ip("netns", "add", name)
        self.namespaces.append(name)
        return f"/run/netns/{name}"

    def pod_netns(self, name: str) -> str:
        """A new pod namespace (path, as containerd passes CNI_NETNS)."""
        return self._add_netns(f"kgcni-{name}-{self.tag}")

    def delete_netns(self, path: str) -> None:
        name = os.path.basename(path)
        ip("netns", "delete", name)
        self.namespaces.remove(name)

    def _link_kind(self) -> str:
        for kind in ("dummy", "ifb"):
            if ip("-n", self.host, "link", "add", "kgprobe0", "type", kind, check=False).returncode == 0:
                ip("-n", self.host, "link", "del", "kgprobe0")
                return kind
        missing_component("neither dummy nor ifb links can be made in a network namespace")
        return ""

    def add_netdev(self, ifname: str, pci: Path | None = None, netns: str | None = None) -> None:
        """A stand-in netdev in the host namespace (or ``netns``), listed under ``pci``'s net/."""
        ip("-n", netns or self.host, "link", "add", ifname, "type", self.kind)
        if pci is not None:
            (pci / "net" / ifname).mkdir(parents=True)

    def links(self, netns: str | None = None) -> dict[str, str]:
        """Interface name -> MAC in the host namespace (or a pod's, by path)."""
        name = os.path.basename(netns) if netns else self.host
        out = json.loads(ip("-j", "-n", name, "link", "show").stdout or "[]")
        return {entry["ifname"]: entry.get("address", "") for entry in out}

    def tc_classes(self, netns: str, ifname: str) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", os.path.basename(netns), "tc", "class", "show", "dev", ifname],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout

    def close(self) -> None:
        for name in reversed(self.namespaces):
            ip("netns", "delete", name, check=False)
        self.namespaces.clear()

    # --- the plugin ---------------------------------------------------------------------------

    def annotation(self, uid: str, vfs: list[tuple[str, int, int]], node: str = NODE) -> str:
        """A signed allocation giving pod ``uid`` the VFs (name, minMbps, maxMbps)."""
        rdma = tuple(RdmaInterface(vf, VFS[vf][0], low, high) for vf, low, high in vfs)
        return sign(Allocation(node=node, pod_uid=uid, containers={}, rdma=rdma), KEY_ID, KEY)

    def config(self, **overrides: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "cniVersion": "1.1.0",
            "name": "kubegpu",
            "type": "kubegpu-cni",
            "nodeName": NODE,
            "keysDir": str(self.keys),
            "stateDir": str(self.state),
            "sysfsRoot": str(self.root),
            "bandwidth": "tc",
            "capabilities": {"io.kubernetes.cri.pod-annotations": True},
            "prevResult": {
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": "/x"}],
                "ips": [{"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 0}],
            },
        }
        conf.update(overrides)
        return {k: v for k, v in conf.items() if v is not None}

    def start(
        self,
        command: str,
        container: str = "",
        netns: str = "",
        pod: tuple[str, str, str] | None = ("default", "train", "uid-1"),
        annotations: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        """Start the plugin in the lab's host namespace, as a runtime would."""
        conf = dict(config or self.config())
        if annotations is not None:
            conf["runtimeConfig"] = {"io.kubernetes.cri.pod-annotations": annotations}
        cni_args = "IgnoreUnknown=1"
        if pod is not None:
            namespace, name, uid = pod
            cni_args += f";K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
            cni_args += f";K8S_POD_INFRA_CONTAINER_ID={container}"
            if uid:
                cni_args += f";K8S_POD_UID={uid}"
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container,
            "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0",
            "CNI_ARGS": cni_args,
            "CNI_PATH": "/opt/cni/bin",
            **(env or {}),
        }
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.host, self.exe],
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(conf))
        proc.stdin.close()
        return proc

    @staticmethod
    def finish(proc: subprocess.Popen[str]) -> CniRun:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        rc = proc.wait(timeout=60)
        return CniRun(rc, json.loads(out) if out.strip() else None, err)

    def cni(self, command: str, container: str = "", netns: str = "", **kwargs: Any) -> CniRun:
        return self.finish(self.start(command, container, netns, **kwargs))


class Forwarder:
    """A TCP port on 127.0.0.1 inside the lab's host namespace forwarding to ``target`` (host,
    port) in the test's own namespace: the plugin runs in the lab and reaches the test apiserver
    through it. The listening socket is made by a thread that entered the lab namespace (a socket
    stays in the namespace it was made in); the outgoing ones are made in the test's."""

    def __init__(self, lab: NetLab, target: tuple[str, int]) -> None:
        import socket
        import threading

        from pyroute2 import netns

        ip("-n", lab.host, "link", "set", "lo", "up")
        self.target = target
        made: list[socket.socket] = []

        def listen() -> None:  # setns changes only this thread's namespace
            netns.setns(f"/run/netns/{lab.host}")
            server = socket.create_server(("127.0.0.1", 0))
            made.append(server)

        thread = threading.Thread(target=listen)
        thread.start()
        thread.join()
        self.server = made[0]
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                inbound, _ = self.server.accept()
            except OSError:
                return
            outbound = socket.create_connection(self.target)
            for a, b in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: Any, b: Any) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()
