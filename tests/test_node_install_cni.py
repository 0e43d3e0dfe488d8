"""``kubegpu node install --cni-bin-dir`` (kubegpu/nodecni.py): the RDMA CNI plugin's launcher in
the runtime's CNI bin dir, recorded like every file, removed by uninstall, reported by ``check``;
the network config is read, never edited. Same throwaway root and real containerd 1.6 as
tests/test_node_install.py; the launcher runs the installed ``kubegpu-cni`` for real.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from kubegpu.devenv.containerd import Containerd
from tests.support.cnilab import plugin_executable
from tests.test_node_install import KEY, install_args, run, tree
from tests.test_node_install import root as root  # noqa: F401, F811 - the fixture, by its own name

pytestmark = pytest.mark.containerd

LAUNCHER = "opt/cni/bin/kubegpu-cni"
CONFLIST = "etc/cni/net.d/10-pods.conflist"
BRIDGE = {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.88.0.0/16"}}


def network(root: Path, *plugins: dict[str, object]) -> None:
    """The pod network's conflist on the node (what the network add-on writes)."""
    path = root / CONFLIST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cniVersion": "1.0.0", "name": "pods", "plugins": [BRIDGE, *plugins]}))


def cni_node(root: Path) -> str:
    """The node's CNI bin dir and its kubegpu-cni (the installed console script, where the root has
    it at the same absolute path, so the launcher's exec finds it both inside and outside the root);
    returns that path."""
    (root / "opt/cni/bin").mkdir(parents=True)
    binary = plugin_executable()
    inside = root / binary.lstrip("/")
    inside.parent.mkdir(parents=True, exist_ok=True)
    inside.symlink_to(binary)
    network(root)
    return binary


def cni_args(root: Path, containerd: Containerd, binary: str, *extra: str) -> list[str]:
    return install_args(
        root,
        containerd,
        "--device-plugin",
        "rdma",
        "--no-advertise",
        "--key-file",
        "-",
        "--node-name",
        "gpu-7",
        "--cni-bin-dir",
        "/opt/cni/bin",
        "--cni-binary",
        binary,
        *extra,
    )


def cni_lines(out: str) -> dict[str, str]:
    """check's CNI lines: what ('CNI plugin', 'CNI chain') -> the line."""
    return {what: line for line in out.splitlines() for what in ("CNI plugin", "CNI chain") if what in line}


def test_install_writes_a_launcher_that_runs_the_plugin_and_uninstall_removes_it(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = cni_node(root)
    before = tree(root)
    conflist = (root / CONFLIST).read_bytes()
    code, out, err = run(capsys, monkeypatch, *cni_args(root, containerd, binary), stdin=KEY)
    assert code == 0, err
    launcher = root / LAUNCHER
    assert f"wrote     /{LAUNCHER}" in out
    assert launcher.stat().st_mode & 0o777 == 0o755
    assert f"exec '{binary}' \"$@\"\n" in launcher.read_text()
    record = json.loads((root / "etc/kubegpu/node-install.json").read_text())
    assert record["files"][LAUNCHER] == hashlib.sha256(launcher.read_bytes()).hexdigest()
    assert record["settings"]["cni_bin_dir"] == "/opt/cni/bin"
    assert record["settings"]["cni_binary"] == binary
    # the network config is not edited; the stanza to chain is printed, for this node
    assert (root / CONFLIST).read_bytes() == conflist
    assert "kubegpu-cni is not chained yet (/etc/cni/net.d/10-pods.conflist: its plugins (bridge)" in out
    stanza = json.loads(out.split("(docs/cni.md):\n", 1)[1].splitlines()[0])
    assert stanza == {
        "type": "kubegpu-cni",
        "capabilities": {"io.kubernetes.cri.pod-annotations": True},
        "nodeName": "gpu-7",
        "keysDir": "/etc/kubegpu/keys",
    }
    # the launcher is what the runtime runs: it answers as the plugin does
    answer = subprocess.run(
        [str(launcher)],
        input=b'{"cniVersion": "1.0.0"}',
        env={"CNI_COMMAND": "VERSION", "PATH": os.environ["PATH"]},
        capture_output=True,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["supportedVersions"] == ["1.0.0", "1.1.0"]

    # check: the plugin runs, the chain is missing; once chained as printed, both ok
    code, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    lines = cni_lines(out)
    assert lines["CNI plugin"].startswith("  [ok  ] CNI plugin")
    assert f"/{LAUNCHER} runs {binary} (CNI 1.0.0, 1.1.0)" in lines["CNI plugin"]
    assert "[FAIL] CNI chain" in lines["CNI chain"] and "do not chain kubegpu-cni" in lines["CNI chain"]
    assert "pods get no RDMA VFs" in lines["CNI chain"]
    network(root, stanza)
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    assert "[ok  ] CNI chain" in cni_lines(out)["CNI chain"], out
    code, out, _ = run(capsys, monkeypatch, *cni_args(root, containerd, binary), stdin=KEY)
    assert code == 0 and "kubegpu-cni is chained in /etc/cni/net.d/10-pods.conflist" in out
    assert f"unchanged /{LAUNCHER}" in out
    for wrong, message in (
        ({**stanza, "keysDir": "/etc/other-keys"}, "its keysDir is /etc/other-keys, the shim's keys are in"),
        ({**stanza, "nodeName": "gpu-8"}, "its nodeName is gpu-8, this node is gpu-7"),
        (  # the plugin would take the hostname, not the shim's --node-name: every allocation refused
            {k: v for k, v in stanza.items() if k != "nodeName"},
            f"it names no nodeName, so the plugin takes the hostname {socket.gethostname().lower()}, "
            "this node is gpu-7",
        ),
        ({"type": "kubegpu-cni", "keysDir": "/etc/kubegpu/keys"}, 'it lacks "capabilities"'),
    ):
        network(root, wrong)
        _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
        assert "[FAIL] CNI chain" in out and message in out, out
    (root / CONFLIST).write_text("{not json")
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    assert f"/{CONFLIST}: unreadable (" in cni_lines(out)["CNI chain"], out
    (root / CONFLIST).unlink()
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    assert "[FAIL] CNI chain" in out and "/etc/cni/net.d: no network config (*.conf" in out, out
    (root / CONFLIST).write_bytes(conflist)

    # the launcher changed by hand: check says so; uninstall keeps it
    launcher.write_text(launcher.read_text() + "# local\n")
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    changed = cni_lines(out)["CNI plugin"]
    assert "[FAIL] CNI plugin" in changed and f"/{LAUNCHER} was changed since install" in changed
    launcher.write_text(launcher.read_text().removesuffix("# local\n"))
    code, out, _ = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert code == 0 and f"removed   /{LAUNCHER}" in out
    assert tree(root) == before  # the bin dir stays: it was there before


def test_install_without_cni_bin_dir_removes_the_launcher(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = cni_node(root)
    assert run(capsys, monkeypatch, *cni_args(root, containerd, binary), stdin=KEY)[0] == 0
    args = install_args(root, containerd, "--device-plugin", "rdma", "--no-advertise", "--node-name", "gpu-7")
    code, out, err = run(capsys, monkeypatch, *args)
    assert code == 0, err
    assert f"removed   /{LAUNCHER}" in out and not (root / LAUNCHER).exists()
    record = json.loads((root / "etc/kubegpu/node-install.json").read_text())
    assert LAUNCHER not in record["files"] and "cni_bin_dir" not in record["settings"]
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    assert cni_lines(out) == {}


def test_cni_options_and_foreign_files_are_refused(
    root: Path,
    containerd: Containerd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    binary = cni_node(root)
    outside = tmp_path / "outside"
    (outside / "bin").mkdir(parents=True)
    (root / "opt/escape").symlink_to(outside, target_is_directory=True)
    plain = install_args(root, containerd)
    cases = [
        (cni_args(root, containerd, binary, "--cni-bin-dir", "/opt/none"), "--cni-bin-dir /opt/none is not"),
        (cni_args(root, containerd, "/usr/local/bin/none"), "--cni-binary /usr/local/bin/none is not an"),
        (cni_args(root, containerd, binary, "--cni-bin-dir", "opt/cni/bin"), "must be absolute paths"),
        (cni_args(root, containerd, binary, "--cni-bin-dir", "/opt/cni/../cni/bin"), "no '.' or '..'"),
        (cni_args(root, containerd, "/opt/%h/kubegpu-cni"), "--cni-binary '/opt/%h/kubegpu-cni'"),
        ([*plain, "--cni-conf-dir", "/etc/cni/net.d"], "go with --cni-bin-dir"),
        ([*plain, "--cni-binary", binary], "go with --cni-bin-dir"),
        (
            cni_args(root, containerd, binary, "--cni-bin-dir", "/opt/escape/bin"),
            f"/opt/escape/bin/kubegpu-cni leads outside --root, to {outside}/bin/kubegpu-cni",
        ),
    ]
    before = tree(tmp_path)
    for argv, message in cases:
        code, out, err = run(capsys, monkeypatch, *argv, stdin=KEY)
        assert code == 2 and message in err, (argv, out, err)
        assert tree(tmp_path) == before, argv
    # a plugin linked by hand (as docs/cni.md said before install could do it) is not taken over
    (root / LAUNCHER).symlink_to(binary)
    before = tree(tmp_path)
    code, _, err = run(capsys, monkeypatch, *cni_args(root, containerd, binary), stdin=KEY)
    assert code == 2 and f"/{LAUNCHER} already holds something else" in err, err
    assert tree(tmp_path) == before


def test_check_runs_no_plugin_executable_another_user_could_have_chosen_or_written(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """check runs the recorded --cni-binary (VERSION) as root. A record others can write could name
    any program, and an executable others can write could be anything: check reports them and runs
    nothing (before, it ran the planted program as root while reporting the record's owners)."""
    binary = cni_node(root)
    assert run(capsys, monkeypatch, *cni_args(root, containerd, binary), stdin=KEY)[0] == 0
    marker = root / "ran"
    planted = root / "opt/planted"
    planted.write_text(f"#!/bin/sh\necho planted > {marker}\n")
    planted.chmod(0o755)
    record_path = root / "etc/kubegpu/node-install.json"
    record = json.loads(record_path.read_text())
    record["settings"]["cni_binary"] = "/opt/planted"
    record_path.write_text(json.dumps(record))
    record_path.chmod(0o666)  # another user could have written that
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    line = cni_lines(out)["CNI plugin"]
    assert "[FAIL] CNI plugin" in line and "/opt/planted not run" in line, out
    assert f"{record_path} is writable by its group and others" in line
    assert not marker.exists()
    record_path.chmod(0o644)  # the record is root's again; the program others may write is not run
    planted.chmod(0o777)
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    line = cni_lines(out)["CNI plugin"]
    assert "/opt/planted not run" in line and f"{planted} is writable by its group and others" in line, out
    assert not marker.exists()
    planted.chmod(0o755)  # root's alone: check runs it (and reports its non-answer)
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    assert marker.exists() and "[FAIL] CNI plugin" in cni_lines(out)["CNI plugin"], out
