"""``kubegpu node install / uninstall / check --front nri`` (kubegpu/nodeinstall.py) in a throwaway root.

The node agent as containerd's NRI plugin: install writes the agent's NRI drop-in and, where
containerd does not already require the plugin, a containerd drop-in through the config's
``imports`` (never the admin's config.toml), and no kubelet drop-in. containerd is the real 2.2.9
(the CRI Version call says which containerd it is; 1.6 is refused); what containerd makes of the
drop-in is read back with its own ``config dump``, and one test runs containerd with it: no
container is created while the installed agent is away, and `check` reports the live front.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2 as cri
from devices.sim import sim_gpu_id
from kubegpu import containerdconfig, nodeinstall
from kubegpu.allocation import public_key_pem
from kubegpu.devenv.containerd import Containerd, containerd2_bin_dir
from kubegpu.devenv.shimproc import free_port
from tests.fixtures.common import missing_component, require_executable
from tests.fixtures.keys import KEY_ID, OTHER_KEY, SIGNING
from tests.test_node_install import KEY, run, tree, verify_root
from tests.test_node_install import fake_kubelet as fake_kubelet  # noqa: F401, F811 - the fixture
from tests.test_node_install import root as root  # noqa: F401, F811 - the fixture, by its own name
from tests.test_nri_agent import Pods, signed
from tests.test_nri_transport import wait_until

pytestmark = pytest.mark.containerd

REPO = Path(__file__).resolve().parent.parent
NRI = "io.containerd.nri.v1.nri"
CONFIG = "etc/containerd/config.toml"
DROPIN = "etc/containerd/conf.d/99-kubegpu-nri.toml"
AGENT_DROPIN = "etc/systemd/system/kubegpu-crishim.service.d/30-nri.conf"
KUBELET_DROPIN = "etc/systemd/system/kubelet.service.d/20-kubegpu-crishim.conf"
# A containerd 2.x config as a node may have it: drop-ins from conf.d, NRI switched off.
NRI_OFF = f'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n\n[plugins."{NRI}"]\n  disable = true\n'


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def nri_args(root: Path, containerd: Containerd, *extra: str) -> list[str]:
    return [
        "node",
        "install",
        "--root",
        str(root),
        "--front",
        "nri",
        "--containerd-socket",
        str(containerd.socket),
        "--device-plugin",
        "nvidia",
        "--key-file",
        "-",
        *extra,
    ]


def effective_nri(dump: str) -> dict[str, object]:
    return tomllib.loads(dump)["plugins"][NRI]


def containerd2_binary() -> str:
    bin_dir = containerd2_bin_dir()
    if bin_dir is None:
        missing_component("containerd 2.x is not built: run `bash tests/containerd/build.sh`")
    assert bin_dir is not None
    return str(bin_dir / "containerd")


def config_dump(config: Path) -> str:
    """What containerd 2.2.9 itself makes of ``config`` and its imports."""
    result = subprocess.run(
        [containerd2_binary(), "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# ------------------------------------------------------------------------------------- install


def test_the_shipped_nri_dropin_is_what_install_writes_by_default() -> None:
    settings = nodeinstall.NodeSettings(front="nri", plugins=("nvidia",), advertise=True)
    shipped = (REPO / "systemd/kubegpu-crishim.service.d/30-nri.conf").read_text()
    assert nodeinstall.nri_dropin_text(settings) == shipped
    assert nodeinstall.unit_exec_starts(shipped, ["the base unit's"]) == [
        "/usr/local/bin/kubegpu crishim --front nri --nri-socket /var/run/nri/nri.sock "
        "--nri-plugin-name kubegpu --nri-plugin-index 10 --metrics-address 127.0.0.1:9464 "
        "--device-plugin nvidia --allocation-keys-dir /etc/kubegpu/keys "
        "--kubeconfig /etc/kubegpu/node.kubeconfig --advertise --advertise-interval 10 "
        "--heartbeat-interval 30"
    ]


def test_install_nri_writes_the_agent_and_containerd_dropins_and_leaves_kubelet_alone(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = write(root, CONFIG, NRI_OFF)
    code, out, err = run(capsys, monkeypatch, *nri_args(root, containerd2, "--node-name", "gpu-7"), stdin=KEY)
    assert code == 0, err
    assert "containerd v2.2.9" in out
    agent = (root / AGENT_DROPIN).read_text()
    (command,) = nodeinstall.unit_exec_starts(agent, ["base"])
    for flag in (
        "crishim --front nri",
        "--nri-socket /var/run/nri/nri.sock",
        "--nri-plugin-name kubegpu",
        "--nri-plugin-index 10",
        "--device-plugin nvidia",
        "--node-name gpu-7",
    ):
        assert flag in command
    assert "--listen" not in command and "--runtime-endpoint" not in command
    assert not (root / KUBELET_DROPIN).exists()  # kubelet keeps talking to containerd
    assert config.read_text() == NRI_OFF  # the admin's config is never rewritten
    assert tomllib.loads((root / DROPIN).read_text()) == {
        "version": 3,
        "plugins": {
            NRI: {
                "disable": False,
                "socket_path": "/var/run/nri/nri.sock",
                "default_validator": {"enable": True, "required_plugins": ["kubegpu"]},
            }
        },
    }
    record = json.loads((root / "etc/kubegpu/node-install.json").read_text())
    assert record["settings"]["front"] == "nri"
    assert record["settings"]["nri_socket"] == "/var/run/nri/nri.sock"
    assert set(record["files"]) == {
        "etc/systemd/system/kubegpu-crishim.service",
        AGENT_DROPIN,
        DROPIN,
        "etc/kubegpu/keys/k1",
    }
    assert "etc/containerd/conf.d" in record["dirs"]
    # containerd first (NRI on, the plugin required), then the agent; kubelet is not restarted
    steps = out[out.index("next,") :]
    assert (
        steps.index("systemctl restart containerd.service")
        < steps.index("systemctl enable kubegpu-crishim.service")
        < steps.index("systemctl restart kubegpu-crishim.service")
    )
    assert "kubelet" not in steps


def test_nri_install_twice_changes_nothing_and_uninstall_restores_the_tree(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(root, CONFIG, NRI_OFF)
    before = tree(root)
    assert run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)[0] == 0
    installed = tree(root)
    mtimes = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    code, out, err = run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)
    assert code == 0, err
    assert "wrote" not in out and out.count("unchanged") == 4
    assert "restart containerd.service" not in out  # its config did not change
    assert tree(root) == installed
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == mtimes

    code, out, _ = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert code == 0
    assert f"removed   /{DROPIN}" in out and out.count("removed") == 4
    # the agent stops first; containerd must then stop requiring it
    assert "systemctl disable --now kubegpu-crishim.service" in out
    assert "systemctl restart containerd.service" in out and "kubelet" not in out
    assert tree(root) == before
    assert run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)[0] == 0
    assert tree(root) == installed


def test_nothing_is_written_for_a_containerd_that_already_requires_the_agent(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(
        root,
        CONFIG,
        f'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n[plugins."{NRI}"]\n'
        f'  socket_path = "/run/nri/admin.sock"\n[plugins."{NRI}".default_validator]\n'
        '  enable = true\n  required_plugins = ["kubegpu", "other"]\n',
    )
    code, out, err = run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)
    assert code == 0, err
    assert not (root / "etc/containerd/conf.d").exists()
    assert "restart containerd.service" not in out
    assert "--nri-socket /run/nri/admin.sock" in (root / AGENT_DROPIN).read_text()  # containerd's socket
    record = json.loads((root / "etc/kubegpu/node-install.json").read_text())
    assert DROPIN not in record["files"]


# A config generated by `containerd config default` (2.2.9): NRI on, the validator off.
def generated_default() -> str:
    result = subprocess.run([containerd2_binary(), "config", "default"], capture_output=True, text=True)
    assert result.returncode == 0 and "imports = ['/etc/containerd/conf.d/*.toml']" in result.stdout
    return result.stdout.replace("imports = ['/etc/containerd/conf.d/*.toml']", "imports = ['conf.d/*.toml']")


@pytest.mark.parametrize(
    "admin",
    [
        NRI_OFF.replace("/etc/containerd/conf.d", "conf.d"),
        # version 2 (containerd 1.7's layout, migrated by 2.x at load): the drop-in must say 2 too,
        # or containerd would take the whole config as version 3 and lose the admin's CRI settings
        'version = 2\nimports = ["conf.d/*.toml"]\n[plugins."io.containerd.grpc.v1.cri"]\n'
        f'  sandbox_image = "registry.example/pause:9"\n[plugins."{NRI}"]\n  disable = true\n'
        '  plugin_request_timeout = "3s"\n',
        None,
    ],
    ids=["v3-nri-off", "v2-nri-off", "generated-default"],
)
def test_containerd_reads_the_dropin_as_install_means_it(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    admin: str | None,
) -> None:
    """containerd merges imports key by key over its config and replaces lists; install writes
    the drop-in for that, and containerd's own `config dump` shows the result."""
    config = write(root, CONFIG, admin if admin is not None else generated_default())
    before = config_dump(config)
    code, _, err = run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)
    assert code == 0, err
    after = config_dump(config)
    nri = effective_nri(after)
    assert nri["disable"] is False and nri["disable_connections"] is False
    assert nri["socket_path"] == "/var/run/nri/nri.sock"
    assert nri["default_validator"]["enable"] is True
    assert nri["default_validator"]["required_plugins"] == ["kubegpu"]
    assert nri["default_validator"]["tolerate_missing_plugins_annotation"] == ""
    # and everything else is as the admin had it
    old, new = tomllib.loads(before), tomllib.loads(after)
    old["plugins"].pop(NRI), new["plugins"].pop(NRI)
    assert old == new
    if admin is not None and "version = 2" in admin:
        assert new["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == (
            "registry.example/pause:9"
        )
        assert nri["plugin_request_timeout"] == "3s"
    # install's own reading of the merged config agrees with containerd's
    view = containerdconfig.read_containerd_config(root, "/" + CONFIG)
    assert view.nri_enabled and view.required == ("kubegpu",) and view.socket == "/var/run/nri/nri.sock"


def test_what_nri_install_writes_passes_systemd_analyze_verify(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    analyze = require_executable("systemd-analyze")
    write(root, CONFIG, NRI_OFF)
    code, _, err = run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)
    assert code == 0, err
    verify_root(root)
    result = subprocess.run(
        [analyze, "verify", "--man=no", f"--root={root}", "/etc/systemd/system/kubegpu-crishim.service"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


# ----------------------------------------------------------------------------------- refusals


def refusal_cases() -> list[tuple[str, dict[str, str], list[str], str]]:
    """(id, files under the root, extra install options, message)."""
    imports = 'imports = ["/etc/containerd/conf.d/*.toml"]\n'
    section = f'[plugins."{NRI}"]\n'
    validator = f'[plugins."{NRI}".default_validator]\n'
    return [
        ("no-config", {}, [], "no containerd config at /etc/containerd/config.toml"),
        (
            "no-imports",
            {CONFIG: f"version = 3\n{section}  disable = true\n"},
            [],
            'imports no drop-in directory: add imports = ["/etc/containerd/conf.d/*.toml"]',
        ),
        ("version-1", {CONFIG: f"{imports}{section}  disable = true\n"}, [], "config version 1"),
        ("bad-toml", {CONFIG: "version = 3\nimports = [\n"}, [], "is not valid TOML"),
        (
            "disabled-plugin",
            {CONFIG: f'version = 3\n{imports}disabled_plugins = ["{NRI}"]\n'},
            [],
            f"disabled_plugins lists {NRI}",
        ),
        (
            "no-connections",
            {CONFIG: f"version = 3\n{imports}{section}  disable_connections = true\n"},
            [],
            "disable_connections = true",
        ),
        (
            "tolerate",
            {CONFIG: f'version = 3\n{imports}{validator}  tolerate_missing_plugins_annotation = "x.io/t"\n'},
            [],
            "tolerate_missing_plugins_annotation",
        ),
        (
            "other-required",
            {CONFIG: f'version = 3\n{imports}{validator}  enable = true\n  required_plugins = ["other"]\n'},
            [],
            'add "kubegpu" to required_plugins there',
        ),
        (
            "later-dropin",
            {
                CONFIG: NRI_OFF,
                "etc/containerd/conf.d/zz-site.toml": f"version = 3\n{validator}  required_plugins = []\n",
            },
            [],
            "/etc/containerd/conf.d/zz-site.toml is merged after",
        ),
        ("no-device-plugin", {CONFIG: NRI_OFF}, ["--no-device-plugin"], "--front nri needs --device-plugin"),
        (
            "hand-made-devices-dropin",
            {CONFIG: NRI_OFF, AGENT_DROPIN.replace("30-nri", "30-devices"): "[Service]\nExecStart=\n"},
            [],
            "30-devices.conf is another front's drop-in",
        ),
        (
            "kubelet-on-a-shim",
            {CONFIG: NRI_OFF, KUBELET_DROPIN: (REPO / "systemd" / KUBELET_DROPIN[19:]).read_text()},
            [],
            "points kubelet at the CRI shim",
        ),
    ]


@pytest.mark.parametrize("case", refusal_cases(), ids=lambda case: case[0])
def test_nri_install_refuses_and_writes_nothing(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, dict[str, str], list[str], str],
) -> None:
    _, files, extra, message = case
    for rel, text in files.items():
        write(root, rel, text)
    before = tree(root)
    argv = nri_args(root, containerd2)
    if extra == ["--no-device-plugin"]:
        argv = [a for a in argv if a not in ("--device-plugin", "nvidia")]
    code, out, err = run(capsys, monkeypatch, *argv, stdin=KEY)
    assert code == 2, out + err
    assert message in err, err
    assert err.startswith("kubegpu node") and err.count("\n") == 1, err
    assert tree(root) == before


def test_nri_is_refused_on_containerd_1(
    root: Path,
    containerd: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(root, CONFIG, NRI_OFF)
    before = tree(root)
    code, _, err = run(capsys, monkeypatch, *nri_args(root, containerd), stdin=KEY)
    assert code == 2
    assert "containerd 1.6" in err and "--front nri needs containerd 2.2 or later" in err
    assert tree(root) == before


def test_a_cri_install_refuses_a_hand_made_nri_dropin(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shutil.copytree(
        REPO / "systemd/kubegpu-crishim.service.d", root / "etc/systemd/system/kubegpu-crishim.service.d"
    )
    before = tree(root)
    cri = ["node", "install", "--root", str(root), "--containerd-socket", str(containerd2.socket)]
    code, _, err = run(capsys, monkeypatch, *cri, "--device-plugin", "nvidia", "--key-file", "-", stdin=KEY)
    assert code == 2 and f"/{AGENT_DROPIN} is another front's drop-in" in err, err
    assert tree(root) == before


def test_switching_fronts_in_place_is_refused_with_what_to_do(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(root, CONFIG, NRI_OFF)
    cri = ["node", "install", "--root", str(root), "--containerd-socket", str(containerd2.socket)]
    assert run(capsys, monkeypatch, *cri, "--device-plugin", "nvidia", "--key-file", "-", stdin=KEY)[0] == 0
    as_cri = tree(root)
    code, _, err = run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)
    assert code == 2
    assert "this node runs the cri front" in err and "kubegpu node uninstall" in err and "drain" in err
    assert tree(root) == as_cri
    assert run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))[0] == 0
    assert run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)[0] == 0
    code, _, err = run(capsys, monkeypatch, *cri, "--device-plugin", "nvidia")
    assert code == 2 and "this node runs the nri front" in err


def test_a_failed_write_rolls_back_the_containerd_dropin_too(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(root, CONFIG, NRI_OFF)
    before = tree(root)
    real_write = nodeinstall.Transaction.write
    written: list[Path] = []

    def failing_write(self: nodeinstall.Transaction, rel: Path, data: bytes, mode: int) -> bool:
        if written and written[-1] == Path(DROPIN):
            raise OSError(28, "No space left on device")
        written.append(rel)
        return real_write(self, rel, data, mode)

    monkeypatch.setattr(nodeinstall.Transaction, "write", failing_write)
    code, _, err = run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)
    assert Path(DROPIN) in written
    assert code == 2 and "No space left on device" in err and "nothing was changed" in err
    assert tree(root) == before


# ------------------------------------------------- the real containerd, the installed agent, check


@pytest.fixture
def short_root() -> Iterator[Path]:
    """A root short enough for containerd's sockets under it (unix socket paths are short)."""
    path = Path(tempfile.mkdtemp(prefix="kgni-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def agent_command(root: Path) -> list[str]:
    """The agent's command line as systemd would run it from the installed unit and drop-in,
    with this checkout's kubegpu and the root's files (the unit names them as on the node)."""
    system = root / "etc/systemd/system"
    commands = nodeinstall.unit_exec_starts((system / "kubegpu-crishim.service").read_text(), [])
    (command,) = nodeinstall.unit_exec_starts((root / AGENT_DROPIN).read_text(), commands)
    argv = command.split()
    assert argv[0] == "/usr/local/bin/kubegpu"
    local = [str(root) + a if a.startswith("/etc/kubegpu/") else a for a in argv[1:]]
    return [sys.executable, "-m", "kubegpu", *local, "--no-pod-cache", "--telemetry-interval", "0"]


def restarted(containerd: Containerd, pods: Pods) -> None:
    """Restart containerd and wait until its CRI server serves again (it answers UNAVAILABLE,
    "server is not initialized yet", for a moment after its socket is back)."""
    containerd.restart()

    def serving() -> bool:
        try:
            pods.client.runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=5)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(serving, 30, "containerd's CRI server after its restart")


def test_installed_nri_front_fails_closed_on_containerd_and_check_reports_it(
    short_root: Path,
    fake_kubelet: Callable[..., int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """containerd 2.2.9 with NRI on and nothing required (its config in the root, imports from
    conf.d): after install and a containerd restart no container is created until the installed
    agent registers; check reports the NRI front live and containerd requiring it; killed, the
    agent is missed by both; uninstall and a restart give containerd back its creates."""
    require_executable("runc")
    root = short_root
    nri_socket = root / "run/nri/nri.sock"
    nri_socket.parent.mkdir(parents=True)
    containerd = Containerd(
        base=root / "etc/containerd",
        bin_dir=Path(containerd2_binary()).parent,
        nri_socket=nri_socket,
        config_imports=("conf.d/*.toml",),
    )
    agent: subprocess.Popen[bytes] | None = None
    pods: Pods | None = None
    try:
        try:
            containerd.start()
        except Exception as exc:  # noqa: BLE001 - reported as a missing component
            missing_component(f"containerd 2.x with NRI could not start: {exc}")
        pods = Pods(containerd, root / "logs")
        assert isinstance(pods.create("before-install", None), str)  # NRI on, nothing required

        metrics = f"127.0.0.1:{free_port()}"
        install = [
            "node", "install", "--root", str(root), "--front", "nri",
            "--containerd-socket", str(containerd.socket), "--device-plugin", "sim",
            "--sim-topology", "dgx1-v100", "--sim-state-dir", str(root / "sim"), "--node-name", "nri-node",
            "--no-advertise", "--metrics-address", metrics, "--key-id", KEY_ID, "--key-file", "-",
        ]  # fmt: skip
        code, out, err = run(capsys, monkeypatch, *install, stdin=public_key_pem(SIGNING[KEY_ID]))
        assert code == 0, err
        assert f"wrote     /{DROPIN}" in out
        assert f"--nri-socket {nri_socket}" in (root / AGENT_DROPIN).read_text()

        restarted(containerd, pods)
        refused = pods.create("agent-not-started", None)
        assert isinstance(refused, grpc.RpcError), "created with the required agent away"
        assert 'required plugin "kubegpu" not present' in (refused.details() or "")

        log = open(root / "agent.log", "ab")  # noqa: SIM115 - the process owns it
        agent = subprocess.Popen(
            agent_command(root), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        made: list[object] = []

        def granted() -> bool:
            made.append(pods.create(f"gpu-{len(made)}", lambda uid: signed(uid, [sim_gpu_id("nri-node", 0)])))
            return isinstance(made[-1], str)

        wait_until(granted, 30, "the installed agent to register and grant the GPU")
        forged = pods.create("forged", lambda uid: signed(uid, [sim_gpu_id("nri-node", 1)], OTHER_KEY))
        assert isinstance(forged, grpc.RpcError) and "does not verify" in (forged.details() or ""), forged

        kubelet = fake_kubelet(f"--container-runtime-endpoint={containerd.endpoint}")
        check = ["node", "check", "--root", str(root), "--kubelet-pid", str(kubelet)]
        code, out, err = run(capsys, monkeypatch, *check)
        assert code == 0, out + err
        lines = out.strip().splitlines()
        assert len(lines) <= 10 and lines[-1] == "containerd calls a working NRI agent (fail closed)", out
        text = "\n".join(lines)
        assert "[ok  ] front " in text and "NRI: the agent is registered with containerd as kubegpu" in text
        assert f"pid {kubelet} talks to containerd ({containerd.endpoint}" in text
        assert "/readyz registered with containerd" in text
        assert "containerd v2.2.9: NRI on at " in text and "requires kubegpu (fail closed" in text
        assert f"/{DROPIN}" in text

        # a kubelet on the shim's socket would bypass containerd's NRI: said plainly
        shimmed = fake_kubelet("--container-runtime-endpoint=unix:///run/kubegpu/crishim.sock")
        code, out, _ = run(
            capsys, monkeypatch, "node", "check", "--root", str(root), "--kubelet-pid", str(shimmed)
        )
        assert code == 1 and "talks to the CRI shim's socket unix:///run/kubegpu/crishim.sock" in out

        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(10)
        agent = None
        code, out, _ = run(capsys, monkeypatch, *check)
        assert code == 1
        assert "[FAIL] front" in out and "no front is live" in out
        assert "[FAIL] agent health" in out
        assert "[ok  ] containerd NRI" in out  # still required: nothing is created meanwhile
        away = pods.create("agent-killed", None)
        assert isinstance(away, grpc.RpcError) and "not present" in (away.details() or "")

        code, out, _ = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
        assert code == 0 and f"removed   /{DROPIN}" in out
        assert not (root / "etc/containerd/conf.d").exists()
        restarted(containerd, pods)
        deadline = time.monotonic() + 30
        while not isinstance(after := pods.create(f"uninstalled-{time.monotonic()}", None), str):
            assert time.monotonic() < deadline, after
            time.sleep(0.2)
    finally:
        if agent is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGTERM)
            agent.wait(10)
        if pods is not None:
            with contextlib.suppress(grpc.RpcError):
                pods.close()
        containerd.stop()


def test_the_record_digest_of_the_containerd_dropin_guards_an_admins_edit(
    root: Path,
    containerd2: Containerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An admin's edit of the drop-in is neither overwritten by install nor removed by uninstall."""
    write(root, CONFIG, NRI_OFF)
    assert run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)[0] == 0
    dropin = root / DROPIN
    dropin.write_text(dropin.read_text() + "# site note\n")
    edited = hashlib.sha256(dropin.read_bytes()).hexdigest()
    code, _, err = run(capsys, monkeypatch, *nri_args(root, containerd2), stdin=KEY)
    assert code == 2 and "was changed since `kubegpu node install` wrote it" in err
    code, out, _ = run(capsys, monkeypatch, "node", "uninstall", "--root", str(root))
    assert code == 0 and f"kept      /{DROPIN}" in out
    assert hashlib.sha256(dropin.read_bytes()).hexdigest() == edited
