"""``kubegpu node install / uninstall`` under the conditions a hostile reviewer tried: interrupted
half-way (Ctrl-C, SIGKILL), files of ours edited by the admin, kubelet units that are not
kubeadm's, path spellings that leave ``--root``. Same throwaway root and real containerd as
tests/test_node_install.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kubegpu import nodeinstall
from kubegpu.allocation import public_key_pem
from kubegpu.devenv.containerd import Containerd
from tests.fixtures.keys import private_key
from tests.test_node_install import KEY, install_args, run, tree
from tests.test_node_install import root as root  # noqa: F401, F811 - the fixture, by its own name

pytestmark = pytest.mark.containerd

REPO = Path(__file__).resolve().parent.parent
KUBELET_DROPIN = "etc/systemd/system/kubelet.service.d/20-kubegpu-crishim.conf"
SHIM_UNIT = "etc/systemd/system/kubegpu-crishim.service"


# --------------------------------------------------------------------------- interrupted installs


def test_ctrl_c_half_way_puts_everything_back(root: Path, containerd: Containerd) -> None:
    """A KeyboardInterrupt (not an OSError) between two writes still rolls back every file."""
    before = tree(root)
    real_write = nodeinstall.Transaction.write
    calls = {"n": 0}

    def interrupted(self: nodeinstall.Transaction, rel: Path, data: bytes, mode: int) -> bool:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_write(self, rel, data, mode)

    settings = nodeinstall.NodeSettings(runtime_endpoint=f"unix://{containerd.socket}", plugins=("nvidia",))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nodeinstall.Transaction, "write", interrupted)
        with pytest.raises(KeyboardInterrupt):
            nodeinstall.install(root, settings, {"k1": KEY})
    assert calls["n"] == 3
    assert tree(root) == before


def install_killed_after(node: Path, containerd: Containerd, victim: str, *extra: str) -> int:
    """Run ``kubegpu node install`` in a child that SIGKILLs itself right after ``victim`` (a path
    under the node's root) was renamed into place; return the child's exit status."""
    args = install_args(node, containerd, "--device-plugin", "nvidia", "--key-file", "-", *extra)
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        real = os.replace
        def replace(src, dst, *a, **k):
            real(src, dst, *a, **k)
            if str(dst).endswith({victim!r}):
                os.kill(os.getpid(), signal.SIGKILL)
        os.replace = replace
        from kubegpu import cli
        sys.exit(cli.main({args!r}))
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], input=KEY, cwd=REPO, capture_output=True, timeout=120
    )
    return child.returncode


@pytest.mark.parametrize("victim", [SHIM_UNIT, KUBELET_DROPIN, "etc/kubegpu/keys/k1"])
def test_killed_half_way_then_uninstall_restores_the_tree(
    root: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    victim: str,
) -> None:
    """SIGKILL (no rollback runs) after some files were written: uninstall must still remove them;
    kubelet must not be left pointing at a shim that is no longer installed."""
    before = tree(root)
    assert install_killed_after(root, containerd, victim) == -signal.SIGKILL
    assert (root / victim).exists()
    code, out, err = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert code == 0, err
    assert tree(root) == before, out


def test_killed_half_way_then_install_again_with_other_options(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator re-runs install after the crash, with other options: it completes, and
    uninstall then restores the tree."""
    before = tree(root)
    assert install_killed_after(root, containerd, KUBELET_DROPIN, "--node-name", "n1") == -signal.SIGKILL
    args = install_args(root, containerd, "--device-plugin", "nvidia", "--key-file", "-", "--node-name", "n2")
    code, out, err = run(capsys, monkeypatch, *args, stdin=KEY)
    assert code == 0, err
    devices = root / "etc/systemd/system/kubegpu-crishim.service.d/30-devices.conf"
    assert "--node-name n2" in devices.read_text()
    assert run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))[0] == 0
    assert tree(root) == before


def test_upgrade_killed_half_way_then_uninstall_removes_old_and_new_files(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completed install, then a second one with other options killed after its first file:
    files still as the first install wrote them are ours too."""
    before = tree(root)
    args = install_args(root, containerd, "--device-plugin", "nvidia", "--key-file", "-", "--node-name", "n1")
    assert run(capsys, monkeypatch, *args, stdin=KEY)[0] == 0
    devices = "etc/systemd/system/kubegpu-crishim.service.d/30-devices.conf"
    assert install_killed_after(root, containerd, devices, "--node-name", "n2") == -signal.SIGKILL
    code, out, err = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert code == 0, err
    assert "kept" not in out
    assert tree(root) == before


# ------------------------------------------------------------------------- files the admin edited


@pytest.mark.parametrize("name", [SHIM_UNIT, KUBELET_DROPIN])
def test_install_again_never_overwrites_an_admin_edit(
    root: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    """uninstall keeps a file of ours changed since install; install again must not silently
    throw that change away either: refused, one line, nothing written."""
    args = install_args(root, containerd, "--key-file", "-")
    assert run(capsys, monkeypatch, *args, stdin=KEY)[0] == 0
    path = root / name
    path.write_text(path.read_text() + "# LimitNOFILE raised by the admin\n")
    before = tree(root)
    code, _, err = run(capsys, monkeypatch, *install_args(root, containerd, "--node-name", "x"))
    assert code == 2, err
    assert f"/{name} was changed since `kubegpu node install` wrote it" in err
    assert err.count("\n") == 1
    assert tree(root) == before


# ------------------------------------------------------------------------ kubelet units not kubeadm's


def effective_exec_start(node: Path) -> str:
    """kubelet's ExecStart after every drop-in, ours included (systemd's rules)."""
    return nodeinstall.kubelet_exec_start(node, include_ours=True) or ""


HARD_WAY_UNIT = """\
[Unit]
Description=Kubernetes Kubelet
# a comment with ExecStart=/bin/false in it
[Service]
ExecStart=/usr/local/bin/kubelet \\
  --config=/var/lib/kubelet/kubelet-config.yaml \\
  --kubeconfig=/var/lib/kubelet/kubeconfig \\
  --v=2
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def test_a_kubelet_unit_without_kubeadm_keeps_its_command_line(
    tmp_path: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kubelet.service of its own (binary in /usr/local/bin, flags on the command line, no
    10-kubeadm.conf): our drop-in must keep that command line and append the shim's flags, not
    replace it with kubeadm's (which would start /usr/bin/kubelet without its config)."""
    node = tmp_path / "node"
    (node / "etc/systemd/system").mkdir(parents=True)
    (node / "etc/systemd/system/kubelet.service").write_text(HARD_WAY_UNIT)
    before = tree(node)
    code, _, err = run(capsys, monkeypatch, *install_args(node, containerd))
    assert code == 0, err
    assert effective_exec_start(node) == (
        "/usr/local/bin/kubelet --config=/var/lib/kubelet/kubelet-config.yaml "
        "--kubeconfig=/var/lib/kubelet/kubeconfig --v=2 $KUBEGPU_KUBELET_ARGS"
    )
    again = run(capsys, monkeypatch, *install_args(node, containerd))
    assert again[0] == 0 and "wrote" not in again[1]
    assert run(capsys, monkeypatch, "node", "uninstall", "--root", str(node))[0] == 0
    assert tree(node) == before


def test_kubeadm_kubelet_gets_the_shipped_dropin(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubeadm's own 10-kubeadm.conf line: the drop-in is byte for byte the shipped one."""
    kubeadm = root / "usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf"
    kubeadm.write_text(
        kubeadm.read_text().replace(
            "$KUBELET_KUBECONFIG_ARGS $KUBELET_KUBEADM_ARGS",
            "$KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS",
        )
    )
    assert run(capsys, monkeypatch, *install_args(root, containerd))[0] == 0
    shipped = (REPO / "systemd/kubelet.service.d/20-kubegpu-crishim.conf").read_text()
    assert (root / KUBELET_DROPIN).read_text() == shipped


def test_an_admin_override_in_etc_masks_the_packaged_unit(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """/etc/systemd/system/kubelet.service wins over the packaged one; its drop-ins still apply."""
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/kubelet.service").write_text(
        "[Service]\nExecStart=/opt/bin/kubelet --config=/etc/kubelet.yaml\n"
    )
    (root / "usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf").unlink()
    assert run(capsys, monkeypatch, *install_args(root, containerd))[0] == 0
    assert effective_exec_start(root) == "/opt/bin/kubelet --config=/etc/kubelet.yaml $KUBEGPU_KUBELET_ARGS"


# ------------------------------------------------------------------------------ path spellings


@pytest.mark.parametrize("flag", ["--keys-dir", "--kubegpu-binary", "--kubeconfig"])
def test_a_path_that_climbs_out_is_refused(
    root: Path,
    tmp_path: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
) -> None:
    """``..`` in a path install writes under --root (or names in a unit) would escape --root."""
    before = tree(tmp_path)
    value = "/etc/kubegpu/../../../escaped"
    code, _, err = run(
        capsys, monkeypatch, *install_args(root, containerd, flag, value, "--key-file", "-"), stdin=KEY
    )
    assert code == 2, err
    assert f"{flag} {value!r}: no '.' or '..' components" in err
    assert tree(tmp_path) == before


@pytest.mark.parametrize("spelling", ["relative", "trailing-slash", "dotdot", "symlink"])
def test_root_spellings_name_one_install(
    root: Path,
    tmp_path: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    spelling: str,
) -> None:
    """Install with --root spelled one way, install again and uninstall spelled another."""
    before = tree(root)
    (tmp_path / "link").symlink_to(root)
    monkeypatch.chdir(tmp_path)
    other = {
        "relative": "root",
        "trailing-slash": f"{root}/",
        "dotdot": f"{root}/../root",
        "symlink": str(tmp_path / "link"),
    }[spelling]
    assert run(capsys, monkeypatch, *install_args(root, containerd, "--key-file", "-"), stdin=KEY)[0] == 0
    args = ["node", "install", "--root", other, "--containerd-socket", str(containerd.socket)]
    code, out, err = run(capsys, monkeypatch, *args)
    assert code == 0 and "wrote" not in out, (out, err)
    assert run(capsys, monkeypatch, "node", "uninstall", "--root", other)[0] == 0
    assert tree(root) == before


# ---------------------------------------------------------------- check: kubelet's runtime endpoint


def test_check_reads_kubelet_config_as_kubelet_does(tmp_path: Path) -> None:
    """A relative --config is kubelet's cwd's; a symlinked, commented config file reads the same;
    a --config-dir drop-in overrides the file; a flag overrides both."""
    cwd = tmp_path / "kubelet-cwd"
    (cwd / "conf.d").mkdir(parents=True)
    real = tmp_path / "real-config.yaml"
    real.write_text(
        "# kubelet config, managed by config management\n"
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "containerRuntimeEndpoint: unix:///run/kubegpu/crishim.sock  # the shim\n"
    )
    (cwd / "kubelet.yaml").symlink_to(real)
    shim = "unix:///run/kubegpu/crishim.sock"
    endpoint, source = nodeinstall.kubelet_endpoint(["kubelet", "--config", "kubelet.yaml"], cwd=cwd)
    assert (endpoint, source) == (shim, f"containerRuntimeEndpoint in {cwd / 'kubelet.yaml'}")
    # a drop-in of --config-dir wins over the file (kubelet merges them, later names last)
    (cwd / "conf.d/10-a.conf").write_text("containerRuntimeEndpoint: unix:///run/a.sock\n")
    (cwd / "conf.d/20-b.conf").write_text("containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
    (cwd / "conf.d/30-c.yaml").write_text("containerRuntimeEndpoint: unix:///ignored.sock\n")  # not *.conf
    argv = ["kubelet", "--config=kubelet.yaml", "--config-dir", "conf.d"]
    endpoint, source = nodeinstall.kubelet_endpoint(argv, cwd=cwd)
    assert endpoint == "unix:///run/containerd/containerd.sock"
    assert source == f"containerRuntimeEndpoint in {cwd / 'conf.d/20-b.conf'}"
    endpoint, source = nodeinstall.kubelet_endpoint([*argv, f"--container-runtime-endpoint={shim}"], cwd=cwd)
    assert (endpoint, source) == (shim, "--container-runtime-endpoint")


def test_uninstall_disable_now_stops_nothing_while_another_install_runs(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--disable-now stops the shim (and, through the drop-in's Requires=, kubelet) only once it
    holds the lock: refused for a concurrent install, it must leave both running."""
    import fcntl

    assert run(capsys, monkeypatch, *install_args(root, containerd, "--key-file", "-"), stdin=KEY)[0] == 0
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(nodeinstall, "systemd_running", lambda _root: True)
    monkeypatch.setattr(nodeinstall, "run_systemctl", lambda steps: ran.extend(tuple(s) for s in steps))
    before = tree(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code, _, err = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root), "--disable-now")
    finally:
        os.close(fd)
    assert code == 1 and "another `kubegpu node install/uninstall` is running" in err
    assert ran == []
    assert tree(root) == before
    code, _, err = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root), "--disable-now")
    assert code == 0, err
    assert ran == [
        ("disable", "--now", "kubegpu-crishim.service"),
        ("daemon-reload",),
        ("restart", "kubelet.service"),
    ]


@pytest.mark.parametrize("source", ["/dev/zero", "-"])
def test_an_endless_key_is_refused_not_read_whole(
    tmp_path: Path, containerd: Containerd, source: str
) -> None:
    """--key-file /dev/zero (or an endless stdin) is refused after a key file's worth of bytes,
    instead of reading until memory runs out (here: a 1 GiB address-space limit)."""
    node = tmp_path / "node"
    node.mkdir()
    args = install_args(node, containerd, "--key-file", source)
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from kubegpu import cli\n"
        f"sys.exit(cli.main({args!r}))\n"
    )
    with open("/dev/zero", "rb") as zeros:
        child = subprocess.run(
            [sys.executable, "-c", script], stdin=zeros, cwd=REPO, capture_output=True, text=True, timeout=120
        )
    assert child.returncode == 2, child.stderr[-2000:]
    # /dev/zero is not a regular file; an endless stdin is cut after a key file's size
    assert "cannot read the key file" in child.stderr
    assert "not a regular file" in child.stderr or "more than 16384 bytes" in child.stderr
    assert child.stderr.count("\n") == 1
    assert list(node.iterdir()) == []


def test_no_file_is_written_through_a_symlink_out_of_the_root(
    root: Path,
    containerd: Containerd,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/etc/systemd under --root leading out of it: install refuses instead of writing the unit
    there (its record would name a path uninstall refuses to touch)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "etc/systemd").symlink_to(outside, target_is_directory=True)
    before = tree(tmp_path)
    code, _, err = run(capsys, monkeypatch, *install_args(root, containerd))
    assert code == 2 and "/etc/systemd/system/kubegpu-crishim.service leads outside --root" in err, err
    assert tree(tmp_path) == before


# ------------------------------------------------------------------------- a tampered record


def tampered(root: Path, outside: Path, case: str) -> dict[str, object]:
    """An install record naming, in one of several ways, something outside ``root``."""
    digest = hashlib.sha256(outside.read_bytes()).hexdigest()
    escape = os.path.relpath(outside, root)  # ../victim
    (root / "etc/out").symlink_to(outside.parent, target_is_directory=True)
    files, dirs, pending = {SHIM_UNIT: "0" * 64}, ["etc/kubegpu"], {}
    if case == "dotdot-file":
        files[escape] = digest
    elif case == "absolute-file":
        files[str(outside)] = digest
    elif case == "symlinked-file":
        files[f"etc/out/{outside.name}"] = digest
    elif case == "dotdot-dir":
        dirs.append(os.path.relpath(outside.parent / "victim-dir", root))
    elif case == "symlinked-dir":
        dirs.append("etc/out/victim-dir")
    elif case == "pending":
        pending[escape] = [digest]
    elif case == "keys-dir":
        return {"settings": {"keys_dir": "/etc/kubegpu/../../.."}, "files": files, "dirs": dirs}
    elif case == "cni-bin-dir":  # the launcher's directory, as --cni-bin-dir recorded it
        return {"settings": {"cni_bin_dir": "/opt/../../.."}, "files": files, "dirs": dirs}
    doc: dict[str, object] = {"version": "0", "settings": {}, "files": files, "dirs": dirs}
    if pending:
        doc["pending"] = pending
    return doc


@pytest.mark.parametrize(
    "case",
    [
        "dotdot-file",
        "absolute-file",
        "symlinked-file",
        "dotdot-dir",
        "symlinked-dir",
        "pending",
        "keys-dir",
        "cni-bin-dir",
    ],
)
def test_uninstall_refuses_a_record_that_leaves_the_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A record is checked as strictly as install's options before anything is deleted: a path
    with '..', an absolute path or one through a symlink out of --root refuses the whole record."""
    node, outside = tmp_path / "node", tmp_path / "victim"
    (node / "etc/kubegpu").mkdir(parents=True)
    (tmp_path / "victim-dir").mkdir()
    outside.write_text("not kubegpu's\n")
    (node / "etc/systemd/system").mkdir(parents=True)
    (node / SHIM_UNIT).write_text("[Unit]\n")
    (node / "etc/kubegpu/node-install.json").write_text(json.dumps(tampered(node, outside, case)))
    before = tree(tmp_path)
    code, out, err = run(capsys, monkeypatch, "node", "uninstall", "--root", str(node))
    assert code == 1, (out, err)
    assert "node-install.json" in err and "outside --root" in err, err
    assert tree(tmp_path) == before  # nothing deleted: not the victim, not the record, not ours
    code, _, err = run(capsys, monkeypatch, "node", "check", "--root", str(node))
    assert code == 1 and "outside --root" in err


# ------------------------------------------------------------------ who may write what the shim trusts

NOBODY = 65534  # another local user (the tests run as root)


def weaken(root: Path, case: str) -> str:
    """Make something the shim trusts writable by another user than root; the path it names."""
    kubegpu, keys = root / "etc/kubegpu", root / "etc/kubegpu/keys"
    if case.startswith("keys") or case.startswith("key-file"):
        keys.mkdir(mode=0o700)
    if case.startswith("key-file"):
        (keys / "k0").write_bytes(public_key_pem(private_key("planted")))
        (keys / "k0").chmod(0o600)
    target = {"etc": kubegpu, "keys": keys, "key-file": keys / "k0"}[case.rsplit("-", 1)[0]]
    if case.endswith("owner"):
        os.chown(target, NOBODY, NOBODY)
        return f"{target} is owned by uid {NOBODY}, not root"
    target.chmod(0o777 if target.is_dir() else 0o666)
    return f"{target} is writable by its group and others (mode {0o777 if target.is_dir() else 0o666:04o})"


CASES = ["etc-owner", "etc-mode", "keys-owner", "keys-mode", "key-file-owner", "key-file-mode"]


@pytest.mark.parametrize("case", CASES)
def test_install_refuses_a_key_directory_others_can_write(
    root: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    """A pre-existing /etc/kubegpu, keys directory or key file that another user owns or may write
    is refused (a key may have been planted there already), with the path and the fix; nothing is
    written."""
    why = weaken(root, case)
    before = tree(root)
    args = install_args(root, containerd, "--device-plugin", "nvidia", "--key-file", "-")
    code, _, err = run(capsys, monkeypatch, *args, stdin=KEY)
    assert code == 2, err
    assert why in err and "chown root" in err, err
    assert tree(root) == before


def test_check_reports_each_path_others_can_write(
    root: Path, containerd: Containerd, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = install_args(root, containerd, "--device-plugin", "nvidia", "--key-file", "-")
    assert run(capsys, monkeypatch, *args, stdin=KEY)[0] == 0
    _, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    assert "[ok  ] owners" in out
    os.chown(root / "etc/kubegpu/keys/k1", NOBODY, NOBODY)
    (root / "etc/kubegpu").chmod(0o777)
    (root / "etc/kubegpu/node-install.json").chmod(0o666)
    code, out, _ = run(capsys, monkeypatch, "node", "check", "--root", str(root))
    assert code == 1
    line = next(line for line in out.splitlines() if " owners " in line)
    assert line.startswith("  [FAIL] owners")
    for problem in (
        f"{root}/etc/kubegpu is writable by its group and others (mode 0777)",
        f"{root}/etc/kubegpu/node-install.json is writable by its group and others (mode 0666)",
        f"{root}/etc/kubegpu/keys/k1 is owned by uid {NOBODY}, not root",
    ):
        assert problem in line, line
