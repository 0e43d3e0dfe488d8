"""``kubegpu node check`` on the real node: kubelet -> kubegpu crishim -> containerd (the
local-cluster fixture), and on a node whose kubelet talks to containerd directly.

``node install`` writes into a throwaway root, naming the fixture node's real sockets, key and
kubeconfig, so that ``check`` reads the record as on a node it set up; kubelet, the shim,
containerd and the Node object are the fixture's own.
"""

from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path

import pytest

from kubegpu import cli
from kubegpu.localcluster.cluster import LocalCluster
from kubegpu.localcluster.node import LocalNode
from tests.fixtures.localcluster import KubeNode


def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def install_for(node: LocalNode, cluster: LocalCluster, root: Path, *extra: str) -> list[str]:
    """``node install`` arguments that describe ``node`` as the fixture runs it."""
    assert node.containerd is not None
    args = [
        "node",
        "install",
        "--root",
        str(root),
        "--containerd-socket",
        str(node.containerd.socket),
        "--node-name",
        node.name,
        *extra,
    ]
    if node.shim is not None:
        assert node.agent_kubeconfig is not None
        kubeconfig = root / "etc/kubegpu/node.kubeconfig"
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(node.agent_kubeconfig, kubeconfig)
        args += [
            "--listen",
            f"unix://{node.proxy_socket}",
            "--metrics-address",
            f"127.0.0.1:{node.shim.metrics_port}",
            "--device-plugin",
            "sim",
            "--sim-topology",
            node.topology,
            "--sim-state-dir",
            str(node.sim_state_dir),
            "--key-id",
            cluster.key_id,
            "--key-file",
            str(cluster.node_keys / cluster.key_id),
        ]
    return args


def kubelet_pid(node: LocalNode) -> str:
    assert node.kubelet is not None and node.kubelet.component is not None
    assert node.kubelet.component.process is not None
    return str(node.kubelet.component.process.pid)


def test_check_on_the_real_node(
    kube_node: KubeNode,
    local_cluster: LocalCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    code, out = run(capsys, monkeypatch, *install_for(kube_node.node, local_cluster, root))
    assert code == 0, out
    code, out = run(
        capsys,
        monkeypatch,
        "node",
        "check",
        "--root",
        str(root),
        "--kubelet-pid",
        kubelet_pid(kube_node.node),
    )
    assert code == 0, out
    lines = out.strip().splitlines()
    assert len(lines) <= 10 and lines[-1] == "kubelet talks to a working shim", out
    text = "\n".join(lines)
    assert f"talks to the shim (unix://{kube_node.node.proxy_socket}, containerRuntimeEndpoint in" in text
    assert "/healthz ok, /readyz runtime ready" in text
    assert "[ok  ] CRI via shim  containerd 1.6" in text
    assert f"[ok  ] signing keys  {local_cluster.key_id} in /etc/kubegpu/keys" in text
    assert f"8 gpu published on Node {kube_node.name} (heartbeat 20" in text


def test_check_on_a_node_that_bypasses_the_shim(
    local_cluster: LocalCluster,
    kube_node: KubeNode,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kubelet talking to containerd directly: check says so, and that no shim answers."""
    node = local_cluster.add_node("plain-node", proxy="none")
    try:
        root = tmp_path / "root"
        root.mkdir()
        code, out = run(capsys, monkeypatch, *install_for(node, local_cluster, root))
        assert code == 0, out
        code, out = run(
            capsys, monkeypatch, "node", "check", "--root", str(root), "--kubelet-pid", kubelet_pid(node)
        )
        assert code == 1, out
        assert node.containerd is not None
        assert (
            f"talks to {node.containerd.endpoint} (containerRuntimeEndpoint in "
            f"{node.kubelet.config_path}), not to the shim unix:///run/kubegpu/crishim.sock"
        ) in out
        assert "[FAIL] shim health" in out and "[FAIL] CRI via shim" in out
    finally:
        local_cluster.remove_node(node.name)
