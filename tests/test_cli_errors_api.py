"""Runtime failures against a real kube-apiserver: each is one stderr line and exit status 1.

A token the API server does not know (401), a server certificate the kubeconfig's CA did not
sign, credentials without the rights the command needs (403), a Node that does not exist (404).
The CLI runs as a subprocess, as a user runs it (docs/errors.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from kubegpu.devenv.controlplane import ControlPlane, create_fake_node, kubeconfig
from tests.fixtures.keys import write_scheduler_keys

pytestmark = pytest.mark.apiserver
REPO = Path(__file__).resolve().parents[1]


def kubegpu(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", "--log-level", "warning", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=environment,
    )


def one_line(done: subprocess.CompletedProcess[str], status: int, prefix: str, *names: str) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.returncode == status, (done.returncode, done.stderr)
    assert lines[0].startswith(prefix), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return write_scheduler_keys(tmp_path / "keys")


@pytest.fixture
def sim_args(tmp_path: Path) -> list[str]:
    return ["--device-plugin", "sim", "--sim-topology", "pcie-4gpu", "--sim-state-dir", str(tmp_path / "sim")]


def test_unknown_token(control_plane: ControlPlane, keys: Path, tmp_path: Path) -> None:
    path = tmp_path / "token.kubeconfig"
    config = kubeconfig(control_plane.url, control_plane.pki.ca_cert, "nobody", {"token": "not-a-token"})
    path.write_text(yaml.safe_dump(config))
    done = kubegpu("scheduler", "--keys-dir", str(keys), "--kubeconfig", str(path))
    one_line(done, 1, "kubegpu scheduler: the API server at", "401 Unauthorized")


def test_server_certificate_from_another_ca(control_plane: ControlPlane, keys: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-ca.crt"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(tmp_path / "other-ca.key"),
            "-out",
            str(other),
            "-days",
            "1",
            "-subj",
            "/CN=other",
        ],
        check=True,
        capture_output=True,
    )
    admin = yaml.safe_load(control_plane.admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    cluster.pop("certificate-authority-data", None)
    cluster["certificate-authority"] = str(other)
    path = tmp_path / "other-ca.kubeconfig"
    path.write_text(yaml.safe_dump(admin))
    done = kubegpu("scheduler", "--keys-dir", str(keys), "--kubeconfig", str(path))
    one_line(done, 1, "kubegpu scheduler: cannot reach the API server at", "certificate verify failed")


def test_scheduler_without_rights(control_plane: ControlPlane, keys: Path, kube_namespace: str) -> None:
    path = control_plane.service_account_kubeconfig(kube_namespace, "no-rights")
    done = kubegpu("scheduler", "--keys-dir", str(keys), "--kubeconfig", str(path))
    one_line(done, 1, "kubegpu scheduler: the API server refused to list nodes: 403 Forbidden", "no-rights")


def test_advertise_without_rights(
    control_plane: ControlPlane, kube_namespace: str, sim_args: list[str]
) -> None:
    path = control_plane.service_account_kubeconfig(kube_namespace, "no-rights")
    done = kubegpu("advertise", *sim_args, "--node-name", "n-forbidden", "--once", "--kubeconfig", str(path))
    one_line(done, 1, "kubegpu advertise: the API server refused to publish on node n-forbidden: 403")


def test_advertise_to_a_missing_node(control_plane: ControlPlane, sim_args: list[str]) -> None:
    admin = str(control_plane.admin_kubeconfig)
    done = kubegpu("advertise", *sim_args, "--node-name", "n-missing", "--once", "--kubeconfig", admin)
    one_line(
        done, 1, "kubegpu advertise: the API server refused to publish on node n-missing: 404", "n-missing"
    )


def test_advertise_once_works(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, sim_args: list[str]
) -> None:
    """The checks above refuse only what is wrong: the same command against a real Node publishes."""
    core = k8s.CoreV1Api(admin_api)
    create_fake_node(core, "n-cli-ok")
    admin = str(control_plane.admin_kubeconfig)
    done = kubegpu("advertise", *sim_args, "--node-name", "n-cli-ok", "--once", "--kubeconfig", admin)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "kubegpu.io/inventory" in core.read_node("n-cli-ok").metadata.annotations
