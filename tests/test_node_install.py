"""``kubegpu node install / uninstall / check`` (kubegpu/nodeinstall.py) in a throwaway root.

containerd is the real one (the session's private containerd 1.6): install checks its socket
with a CRI Version call. What install writes passes ``systemd-analyze verify``; uninstall leaves
the tree exactly as it was; every bad input leaves the tree untouched. ``check`` runs against a
real shim in front of that containerd, with a stand-in kubelet process (its command line is
what check reads); tests/test_node_install_real.py checks the real node.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu import cli, nodeinstall
from kubegpu.allocation import private_key_pem, public_key_pem
from kubegpu.devenv.containerd import Containerd
from kubegpu.devenv.shimproc import ShimProcess
from tests.fixtures.common import require_executable
from tests.fixtures.keys import private_key
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parent.parent
KEY = public_key_pem(private_key("node-install"))  # a node holds public keys only
PRIVATE = private_key_pem(private_key("node-install"))
HOST_UNITS = Path("/lib/systemd/system")

pytestmark = pytest.mark.containerd


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """path -> (sha256 or 'dir' or 'link:target', mode) of everything under root."""
    out: dict[str, tuple[str, int]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = ("link:" + os.readlink(path), 0)
        elif path.is_dir():
            out[rel] = ("dir", path.stat().st_mode & 0o7777)
        else:
            out[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode & 0o7777)
    return out


def run(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *argv: str,
    stdin: bytes = b"",
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A node's tree with a kubeadm-style kubelet (its unit, 10-kubeadm.conf, flags env)."""
    root = tmp_path / "root"
    dropins = root / "usr/lib/systemd/system/kubelet.service.d"
    dropins.mkdir(parents=True)
    (root / "usr/lib/systemd/system/kubelet.service").write_text(
        "[Unit]\nDescription=kubelet\n[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    (dropins / "10-kubeadm.conf").write_text(
        '[Service]\nEnvironment="KUBELET_KUBECONFIG_ARGS=--kubeconfig=/etc/kubernetes/kubelet.conf"\n'
        "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\nExecStart=\n"
        "ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_KUBEADM_ARGS\n"
    )
    (root / "var/lib/kubelet").mkdir(parents=True)
    (root / "var/lib/kubelet/kubeadm-flags.env").write_text(
        'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock"\n'
    )
    (root / "etc/kubegpu").mkdir(parents=True)
    (root / "etc/kubegpu/node.kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    return root


def install_args(root: Path, containerd: Containerd, *extra: str) -> list[str]:
    return ["node", "install", "--root", str(root), "--containerd-socket", str(containerd.socket), *extra]


# ------------------------------------------------------------------------------------- install


def test_defaults_render_the_shipped_units() -> None:
    settings = nodeinstall.NodeSettings()
    assert nodeinstall.shim_unit_text(settings) == (REPO / "systemd/kubegpu-crishim.service").read_text()
    shipped = (REPO / "systemd/kubelet.service.d/20-kubegpu-crishim.conf").read_text()
    assert nodeinstall.kubelet_dropin_text(settings) == shipped
    assert nodeinstall.devices_dropin_text(settings) is None


def test_install_writes_units_dropins_and_key(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = install_args(
        root,
        containerd,
        "--device-plugin",
        "nvidia",
        "--device-plugin",
        "rdma",
        "--key-id",
        "k1",
        "--key-file",
        "-",
        "--node-name",
        "gpu-7",
    )
    code, out, err = run(capsys, monkeypatch, *args, stdin=KEY)
    assert code == 0, err
    assert "containerd 1.6" in out and "(CRI v1)" in out
    system = root / "etc/systemd/system"
    unit = (system / "kubegpu-crishim.service").read_text()
    assert f"--runtime-endpoint unix://{containerd.socket}" in unit
    devices = (system / "kubegpu-crishim.service.d/30-devices.conf").read_text()
    for flag in (
        "--device-plugin nvidia",
        "--device-plugin rdma",
        "--allocation-keys-dir /etc/kubegpu/keys",
        "--kubeconfig /etc/kubegpu/node.kubeconfig",
        "--advertise",
        "--node-name gpu-7",
    ):
        assert flag in devices
    kubelet = (system / "kubelet.service.d/20-kubegpu-crishim.conf").read_text()
    assert "--container-runtime-endpoint=unix:///run/kubegpu/crishim.sock" in kubelet
    key = root / "etc/kubegpu/keys/k1"
    assert key.read_bytes() == KEY
    assert key.stat().st_mode & 0o777 == 0o600
    assert (root / "etc/kubegpu/keys").stat().st_mode & 0o777 == 0o700
    record = json.loads((root / "etc/kubegpu/node-install.json").read_text())
    assert record["settings"]["plugins"] == ["nvidia", "rdma"]
    assert set(record["files"]) == {
        "etc/systemd/system/kubegpu-crishim.service",
        "etc/systemd/system/kubegpu-crishim.service.d/30-devices.conf",
        "etc/systemd/system/kubelet.service.d/20-kubegpu-crishim.conf",
        "etc/kubegpu/keys/k1",
    }
    assert record["files"]["etc/kubegpu/keys/k1"] == hashlib.sha256(KEY).hexdigest()
    # not run (no --enable-now): printed for the operator
    assert "systemctl daemon-reload\n  systemctl enable --now kubegpu-crishim.service\n" in out
    assert "systemctl restart kubelet.service" in out


def test_install_twice_changes_nothing(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = install_args(root, containerd, "--device-plugin", "nvidia", "--key-file", "-")
    assert run(capsys, monkeypatch, *args, stdin=KEY)[0] == 0
    before = tree(root)
    mtimes = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    code, out, _ = run(capsys, monkeypatch, *args, stdin=KEY)
    assert code == 0
    assert "wrote" not in out and out.count("unchanged") == 4
    assert tree(root) == before
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == mtimes
    # again without the key: the installed key stays
    code, out, err = run(capsys, monkeypatch, *install_args(root, containerd, "--device-plugin", "nvidia"))
    assert code == 0, err
    assert tree(root) == before


def test_dropping_the_plugins_removes_the_devices_dropin(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = install_args(root, containerd, "--device-plugin", "nvidia", "--key-file", "-")
    assert run(capsys, monkeypatch, *args, stdin=KEY)[0] == 0
    code, out, _ = run(capsys, monkeypatch, *install_args(root, containerd))
    assert code == 0
    assert "removed   /etc/systemd/system/kubegpu-crishim.service.d/30-devices.conf" in out
    assert not (root / "etc/systemd/system/kubegpu-crishim.service.d/30-devices.conf").exists()
    assert (root / "etc/kubegpu/keys/k1").read_bytes() == KEY  # keys stay until uninstall


def verify_root(root: Path) -> Path:
    """Complete ``root`` for systemd-analyze: the host's units and stand-in executables."""
    if not (HOST_UNITS / "containerd.service").exists():
        pytest.fail("containerd.service not installed on this host (apt-get install containerd)")
    shutil.copytree(HOST_UNITS, root / "lib/systemd/system", symlinks=True, dirs_exist_ok=True)
    for binary in ("usr/local/bin/kubegpu", "usr/bin/kubelet"):
        path = root / binary
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return root


@pytest.mark.parametrize(
    "plugins", [[], ["--device-plugin", "nvidia", "--device-plugin", "rdma"]], ids=["plain-proxy", "devices"]
)
def test_what_install_writes_passes_systemd_analyze_verify(
    root: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    plugins: list[str],
) -> None:
    analyze = require_executable("systemd-analyze")
    code, _, err = run(
        capsys, monkeypatch, *install_args(root, containerd, *plugins, "--key-file", "-"), stdin=KEY
    )
    assert code == 0, err
    verify_root(root)
    result = subprocess.run(
        [
            analyze,
            "verify",
            "--man=no",
            f"--root={root}",
            "/etc/systemd/system/kubegpu-crishim.service",
            "/usr/lib/systemd/system/kubelet.service",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr
    # and it would have seen a broken drop-in (the test can fail)
    devices = root / "etc/systemd/system/kubegpu-crishim.service.d/31-broken.conf"
    devices.parent.mkdir(exist_ok=True)
    devices.write_text("[Service]\nRestartSec=soon\n")
    broken = subprocess.run(
        [analyze, "verify", "--man=no", f"--root={root}", "/etc/systemd/system/kubegpu-crishim.service"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "31-broken.conf:2: Failed to parse sec value" in broken.stderr


def test_uninstall_removes_exactly_what_install_wrote(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "etc/systemd/system").mkdir(parents=True)  # existed before: must stay
    before = tree(root)
    args = install_args(root, containerd, "--device-plugin", "nvidia", "--key-file", "-")
    assert run(capsys, monkeypatch, *args, stdin=KEY)[0] == 0
    assert tree(root) != before
    code, out, _ = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert code == 0
    assert out.count("removed") == 4
    assert "systemctl disable --now kubegpu-crishim.service" in out
    assert tree(root) == before
    code, out, _ = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert (code, out.strip()) == (
        0,
        "kubegpu node uninstall: nothing to do (no /etc/kubegpu/node-install.json)",
    )


def test_uninstall_keeps_a_file_changed_since_install(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(capsys, monkeypatch, *install_args(root, containerd, "--key-file", "-"), stdin=KEY)[0] == 0
    unit = root / "etc/systemd/system/kubegpu-crishim.service"
    unit.write_text(unit.read_text() + "# local change\n")
    code, out, _ = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert code == 0
    assert "kept      /etc/systemd/system/kubegpu-crishim.service (changed since install" in out
    assert unit.exists()
    assert not (root / "etc/systemd/system/kubelet.service.d/20-kubegpu-crishim.conf").exists()
    assert not (root / "etc/kubegpu/keys").exists()


# ----------------------------------------------------------------------------------- bad input


@pytest.fixture
def not_cri_socket(tmp_path: Path) -> Iterator[Path]:
    """A unix socket that accepts and closes every connection (not a gRPC server)."""
    path = Path(f"/tmp/kgni-{uuid.uuid4().hex[:8]}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    import threading

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield path
    server.close()
    path.unlink(missing_ok=True)


def bad_cases(
    root: Path, containerd: Containerd, tmp_path: Path, not_cri: Path
) -> list[tuple[list[str], bytes, str]]:
    regular = tmp_path / "regular-file"
    regular.write_text("x")
    ok = ["--containerd-socket", str(containerd.socket)]
    base = ["node", "install", "--root", str(root)]
    return [
        (base + ["--containerd-socket", str(tmp_path / "nope.sock")], b"", "no containerd socket at"),
        (base + ["--containerd-socket", str(regular)], b"", "is not a socket"),
        (base + ["--containerd-socket", str(not_cri)], b"", "does not answer the CRI v1 Version call"),
        (base + ok + ["--key-file", str(tmp_path / "missing.key")], b"", "cannot read the key file"),
        (base + ok + ["--key-file", str(tmp_path)], b"", "cannot read the key file"),
        (base + ok + ["--key-file", "-"], b"short\n", "key k1: neither PEM nor base64"),
        (
            base + ok + ["--key-file", "-"],
            b"c2hvcnQ=\n",
            "key k1: a raw public key is 32 bytes in base64, this is 5",
        ),
        (
            base + ok + ["--key-file", "-"],
            PRIVATE,
            "key k1 is a private key; a node holds only the public key",
        ),
        (base + ok + ["--key-file", "-", "--key-id", "../k1"], KEY, "key id '../k1'"),
        (
            base + ok + ["--device-plugin", "amd", "--key-file", "-"],
            KEY,
            "unknown device plugin 'amd' (known:",
        ),
        (base + ok + ["--device-plugin", "nvidia"], b"", "device allocation needs a signing key"),
        (
            base + ok + ["--device-plugin", "sim", "--key-file", "-"],
            KEY,
            "the sim plugin needs --sim-topology",
        ),
        (base + ok + ["--node-name", "gpu 7"], b"", "--node-name: 'gpu 7': not a Kubernetes node name"),
        (base + ok + ["--kubegpu-binary", "/opt/%h/kubegpu"], b"", "--kubegpu-binary '/opt/%h/kubegpu'"),
        (base + ok + ["--listen", str(containerd.endpoint)], b"", "is the shim's own socket"),
        (base + ok + ["--enable-now"], b"", "--enable-now needs systemd running this machine"),
        (
            base
            + ok
            + ["--device-plugin", "nvidia", "--key-file", "-", "--kubeconfig", "/etc/none.kubeconfig"],
            KEY,
            "--advertise needs API access, and /etc/none.kubeconfig does not exist",
        ),
    ]


def test_bad_input_is_refused_and_nothing_is_written(
    root: Path,
    containerd: Containerd,
    tmp_path: Path,
    not_cri_socket: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = tree(root)
    for argv, stdin, message in bad_cases(root, containerd, tmp_path, not_cri_socket):
        code, out, err = run(capsys, monkeypatch, *argv, stdin=stdin)
        assert code == 2, (argv, out, err)
        assert message in err, (argv, err)
        assert err.startswith("kubegpu node") and err.count("\n") == 1, err
        assert tree(root) == before, argv


@pytest.mark.parametrize(
    "name, text, message",
    [
        (
            "etc/systemd/system/kubelet.service.d/20-kubegpu-crishim.conf",
            "[Service]\nEnvironment=A=1\n",
            "was not written by `kubegpu node install`",
        ),
        (
            "etc/systemd/system/kubelet.service.d/30-other-cri.conf",
            '[Service]\nEnvironment="X=--container-runtime-endpoint=unix:///run/crio/crio.sock"\n',
            "already sets kubelet's runtime endpoint",
        ),
        (
            "run/systemd/system/kubelet.service.d/90-local.conf",
            "[Service]\nExecStart=\nExecStart=/usr/bin/kubelet\n",
            "sorts after kubegpu's drop-in and sets ExecStart=",
        ),
        ("etc/kubegpu/keys/k1", "another key entirely, 32 bytes..\n", "already holds a different key"),
        (
            "etc/systemd/system/kubegpu-crishim.service",
            "[Service]\nExecStart=/bin/true\n",
            "already holds something else",
        ),
    ],
    ids=["our-name-foreign", "other-runtime", "later-execstart", "other-key", "hand-made-unit"],
)
def test_foreign_files_are_refused(
    root: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    text: str,
    message: str,
) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    before = tree(root)
    code, _, err = run(capsys, monkeypatch, *install_args(root, containerd, "--key-file", "-"), stdin=KEY)
    assert code == 2 and message in err, err
    assert tree(root) == before


def test_a_copy_of_the_shipped_files_is_adopted(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed by hand as docs/deploy.md says (the shipped files): install takes them over."""
    dropin = root / "etc/systemd/system/kubelet.service.d/20-kubegpu-crishim.conf"
    dropin.parent.mkdir(parents=True)
    shutil.copy(REPO / "systemd/kubelet.service.d/20-kubegpu-crishim.conf", dropin)
    code, out, err = run(
        capsys,
        monkeypatch,
        "node",
        "install",
        "--root",
        str(root),
        "--key-file",
        "-",
        "--containerd-socket",
        str(containerd.socket),
        stdin=KEY,
    )
    assert code == 0, err
    # adopted, and rewritten for this node's kubelet command line (the fixture's 10-kubeadm.conf
    # is shorter than kubeadm's; tests/test_node_install_attack.py checks kubeadm's own)
    assert "wrote     /etc/systemd/system/kubelet.service.d/20-kubegpu-crishim.conf" in out
    kubelet = "/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBEGPU_KUBELET_ARGS"
    assert f"ExecStart={kubelet}\n" in dropin.read_text()


def test_a_failed_write_rolls_everything_back(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = install_args(root, containerd, "--key-file", "-")
    assert run(capsys, monkeypatch, *args, stdin=KEY)[0] == 0
    before = tree(root)
    real_write = nodeinstall.Transaction.write
    calls = {"n": 0}

    def failing_write(self: nodeinstall.Transaction, rel: Path, data: bytes, mode: int) -> bool:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real_write(self, rel, data, mode)

    monkeypatch.setattr(nodeinstall.Transaction, "write", failing_write)
    other = install_args(
        root,
        containerd,
        "--device-plugin",
        "nvidia",
        "--node-name",
        "n2",
        "--key-id",
        "k2",
        "--key-file",
        "-",
    )
    code, _, err = run(capsys, monkeypatch, *other, stdin=public_key_pem(private_key("other")))
    assert code == 2 and "No space left on device" in err and "nothing was changed" in err
    assert tree(root) == before


def test_a_malformed_record_is_refused(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "etc/kubegpu/node-install.json").write_text("{not json")
    before = tree(root)
    code, _, err = run(capsys, monkeypatch, *install_args(root, containerd))
    assert code == 2 and "node-install.json is unreadable" in err
    code, _, err = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert code == 1 and "node-install.json is unreadable" in err
    assert tree(root) == before


# ---------------------------------------------------------------------------------------- check


@pytest.fixture
def fake_kubelet() -> Iterator[callable]:
    """Start a process whose command line is a kubelet's (what check reads); killed after."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> int:
        process = subprocess.Popen(
            [
                "bash",
                "-c",
                'exec -a kubelet "$0" -c "import time; time.sleep(300)" "$@"',
                sys.executable,
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(process)
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        wait_for(lambda: cmdline.read_bytes().startswith(b"kubelet\0"))
        return process.pid

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_check_reports_a_working_node_at_a_glance(
    root: Path,
    containerd: Containerd,
    shim: ShimProcess,
    fake_kubelet: callable,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = install_args(
        root,
        containerd,
        "--listen",
        shim.endpoint,
        "--metrics-address",
        f"127.0.0.1:{shim.metrics_port}",
        "--device-plugin",
        "sim",
        "--sim-topology",
        "dgx-a100",
        "--sim-state-dir",
        str(tmp_path / "sim"),
        "--no-advertise",
        "--key-file",
        "-",
    )
    assert run(capsys, monkeypatch, *args, stdin=KEY)[0] == 0
    config = tmp_path / "kubelet-config.yaml"
    config.write_text(
        f"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        f"containerRuntimeEndpoint: {shim.endpoint}\n"
    )
    pid = fake_kubelet("--config", str(config))
    code, out, err = run(capsys, monkeypatch, "node", "check", "--root", str(root), "--kubelet-pid", str(pid))
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert len(lines) <= 10  # one screen
    assert lines[-1] == "kubelet talks to a working shim"
    text = "\n".join(lines)
    assert (
        "[ok  ] kubelet" in text
        and f"pid {pid} talks to the shim ({shim.endpoint}, containerRuntimeEndpoint in" in text
    )
    assert "/healthz ok, /readyz runtime ready" in text
    assert "containerd 1.6" in text and f"through {shim.endpoint}" in text
    assert "[ok  ] signing keys  k1 in /etc/kubegpu/keys" in text
    assert "8 gpu" in text and "discovered here by sim" in text
    assert f"[ok  ] front         CRI proxy: kubelet's endpoint is the shim ({shim.endpoint})" in text

    # kubelet still on containerd: said plainly, exit 1; so no front is live
    direct = fake_kubelet(f"--container-runtime-endpoint={containerd.endpoint}")
    code, out, _ = run(
        capsys, monkeypatch, "node", "check", "--root", str(root), "--kubelet-pid", str(direct)
    )
    assert code == 1
    assert f"talks to {containerd.endpoint} (--container-runtime-endpoint), not to the shim" in out
    no_front = f"[FAIL] front         no front is live: kubelet talks to {containerd.endpoint}, not the shim"
    assert no_front in out
    assert out.strip().splitlines()[-1] == "2 problem(s)"

    # the shim down, the key unreadable: each reported
    shim.stop()
    (root / "etc/kubegpu/keys/k1").write_bytes(b"short")
    code, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root), "--kubelet-pid", str(pid))
    assert code == 1
    assert "[FAIL] shim health" in out and "[FAIL] CRI via shim" in out
    assert "[FAIL] signing keys  k1: key k1: neither PEM nor base64" in out


def test_check_without_an_install(
    tmp_path: Path,
    fake_kubelet: callable,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pid = fake_kubelet()
    code, out, _ = run(
        capsys, monkeypatch, "node", "check", "--root", str(tmp_path), "--kubelet-pid", str(pid)
    )
    assert code == 1
    assert "[FAIL] installed" in out and "not installed by `kubegpu node install`" in out
    assert "talks to unix:///run/containerd/containerd.sock (kubelet's default), not to the shim" in out


def test_one_install_at_a_time(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = tree(root)
        code, _, err = run(capsys, monkeypatch, *install_args(root, containerd))
        assert code == 2 and "another `kubegpu node install/uninstall` is running" in err
        assert tree(root) == before
    finally:
        os.close(fd)
    assert run(capsys, monkeypatch, *install_args(root, containerd))[0] == 0


def test_root_and_terminal_stdin_are_checked(
    tmp_path: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run(capsys, monkeypatch, *install_args(tmp_path / "nowhere", containerd))
    assert code == 2 and "nowhere: No such file or directory" in err

    class Terminal(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(io.BytesIO(KEY)))
    code = cli.main(install_args(tmp_path, containerd, "--key-file", "-"))
    assert code == 2 and "standard input, which is a terminal" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
