"""``kubegpu node install | uninstall | check``: set up a GPU node's agent as docs/deploy.md says.

``install`` checks containerd's CRI socket, then writes the shim's systemd unit (and, with device
plugins, a drop-in with their flags), the kubelet drop-in that points kubelet at the shim, and
the signing key (mode 0600), all-or-nothing, and records what it wrote with each file's digest
in ``/etc/kubegpu/node-install.json``. Running it again with the same options changes nothing.
With ``--front nri`` the same unit runs the agent as containerd's NRI plugin (a drop-in of its
own), kubelet keeps talking to containerd, and containerd's NRI settings come from a drop-in in
a directory its config imports (kubegpu/containerdconfig.py), never from an edit of config.toml.
``uninstall`` removes exactly the recorded files that are still as install wrote them.
``check`` reports, on one screen, which front is live and whether it works. With ``--cni-bin-dir``
install also writes the RDMA CNI plugin's launcher there (kubegpu/nodecni.py), recorded like
every file; it never edits the runtime's network config, whose chain ``check`` reads.

Every path is taken under ``--root`` (default ``/``), so tests install into a throwaway tree.
The file formats and the record are documented in docs/install.md.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from kubegpu import __version__, cliargs
from kubegpu.containerdconfig import (
    DEFAULT_CONFIG,
    DEFAULT_NRI_SOCKET,
    DROPIN_NAMES,
    ConfigError,
    plan_dropin,
    read_containerd_config,
)
from kubegpu.nodecni import (
    DEFAULT_CONF_DIR,
    LAUNCHER_NAME,
    chain_stanza,
    chain_status,
    launcher_text,
    plugin_versions,
)

UNIT_NAME = "kubegpu-crishim.service"
SHIM_UNIT = Path("etc/systemd/system") / UNIT_NAME
SHIM_DEVICES_DROPIN = Path("etc/systemd/system") / f"{UNIT_NAME}.d" / "30-devices.conf"
# --front nri: the same unit runs the agent as containerd's NRI plugin (one unit for both fronts,
# so the two can never run at once and hand out the same devices from two ledgers)
SHIM_NRI_DROPIN = Path("etc/systemd/system") / f"{UNIT_NAME}.d" / "30-nri.conf"
FRONTS = ("cri", "nri")
# containerd that has NRI's default validator (required_plugins): NRI v0.10, first vendored by 2.2
NRI_MIN_CONTAINERD = (2, 2)
KUBELET_DROPIN = Path("etc/systemd/system/kubelet.service.d/20-kubegpu-crishim.conf")
# Where systemd looks for kubelet drop-ins (a name in an earlier directory masks the same name later).
KUBELET_DROPIN_DIRS = tuple(
    Path(d) / "kubelet.service.d"
    for d in (
        "etc/systemd/system",
        "run/systemd/system",
        "usr/local/lib/systemd/system",
        "usr/lib/systemd/system",
        "lib/systemd/system",
    )
)
RECORD = Path("etc/kubegpu/node-install.json")
DEFAULT_KEYS_DIR = "/etc/kubegpu/keys"
DEFAULT_LISTEN = "unix:///run/kubegpu/crishim.sock"
DEFAULT_RUNTIME = "unix:///run/containerd/containerd.sock"
DEFAULT_METRICS = "127.0.0.1:9464"
DEFAULT_KUBECONFIG = "/etc/kubegpu/node.kubeconfig"
DEFAULT_BINARY = "/usr/local/bin/kubegpu"
DEFAULT_CNI_BINARY = "/usr/local/bin/kubegpu-cni"
READY_TRIES = 4
KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")  # as kubegpu/allocation.py
# Unit-file values: no whitespace, quotes, '%' (systemd specifiers), '$' (variables) or '\'.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_@:/.,+=\-\[\]]+$")


class InstallError(Exception):
    """Bad input or a state install must not touch; nothing was written. The message says why."""


# --------------------------------------------------------------------------- what gets written


@dataclass(frozen=True)
class NodeSettings:
    """What ``install`` was asked for (recorded, and read back by ``check`` and ``uninstall``)."""

    runtime_endpoint: str = DEFAULT_RUNTIME
    listen: str = DEFAULT_LISTEN
    metrics_address: str = DEFAULT_METRICS
    plugins: tuple[str, ...] = ()
    keys_dir: str = DEFAULT_KEYS_DIR
    kubeconfig: str = DEFAULT_KUBECONFIG
    advertise: bool = False
    node_name: str | None = None
    sim_topology: str | None = None
    sim_state_dir: str | None = None
    binary: str = DEFAULT_BINARY
    drain_timeout: int = 10
    front: str = "cri"
    # --front nri only (recorded only then)
    nri_plugin_name: str = "kubegpu"
    nri_plugin_index: str = "10"
    nri_socket: str = DEFAULT_NRI_SOCKET  # containerd's NRI socket, read from its config
    containerd_config: str = DEFAULT_CONFIG
    # --cni-bin-dir only (recorded only then): where the launcher goes, what it runs, and the
    # runtime's network config dir that check reads
    cni_bin_dir: str | None = None
    cni_binary: str = DEFAULT_CNI_BINARY
    cni_conf_dir: str = DEFAULT_CONF_DIR

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["plugins"] = list(self.plugins)
        if self.front != "nri":
            for key in NRI_SETTINGS:
                data.pop(key)
        if self.cni_bin_dir is None:
            for key in CNI_SETTINGS:
                data.pop(key)
        return data

    @property
    def cni_launcher(self) -> Path | None:
        """The launcher's path under the root (None: the CNI plugin is not installed)."""
        return Path(self.cni_bin_dir.lstrip("/")) / LAUNCHER_NAME if self.cni_bin_dir else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeSettings:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["plugins"] = tuple(known.get("plugins", ()))
        return cls(**known)


NRI_SETTINGS = ("nri_plugin_name", "nri_plugin_index", "nri_socket", "containerd_config")
CNI_SETTINGS = ("cni_bin_dir", "cni_binary", "cni_conf_dir")


def _continued(argv: Sequence[str]) -> str:
    """A command line for ExecStart= as the shipped unit lays it out: one option per line."""
    lines, i = [argv[0] + " " + argv[1]], 2
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            lines.append(f"{argv[i]} {argv[i + 1]}")
            i += 2
        else:
            lines.append(argv[i])
            i += 1
    return " \\\n    ".join(lines)


def shim_argv(settings: NodeSettings, with_devices: bool) -> list[str]:
    if settings.front == "nri" and with_devices:
        argv = [
            settings.binary,
            "crishim",
            "--front",
            "nri",
            "--nri-socket",
            settings.nri_socket,
            "--nri-plugin-name",
            settings.nri_plugin_name,
            "--nri-plugin-index",
            settings.nri_plugin_index,
            "--metrics-address",
            settings.metrics_address,
        ]
        return argv + device_argv(settings)
    argv = [
        settings.binary,
        "crishim",
        "--listen",
        settings.listen,
        "--runtime-endpoint",
        settings.runtime_endpoint,
        "--metrics-address",
        settings.metrics_address,
        "--drain-timeout",
        str(settings.drain_timeout),
    ]
    return argv + device_argv(settings) if with_devices else argv


def device_argv(settings: NodeSettings) -> list[str]:
    """The device-allocation options, the same for both fronts."""
    argv: list[str] = []
    for plugin in settings.plugins:
        argv += ["--device-plugin", plugin]
    if settings.sim_topology:
        argv += ["--sim-topology", settings.sim_topology]
    if settings.sim_state_dir:
        argv += ["--sim-state-dir", settings.sim_state_dir]
    argv += ["--allocation-keys-dir", settings.keys_dir]
    if settings.advertise:
        argv += [
            "--kubeconfig",
            settings.kubeconfig,
            "--advertise",
            "--advertise-interval",
            "10",
            "--heartbeat-interval",
            "30",
        ]
    if settings.node_name:
        argv += ["--node-name", settings.node_name]
    return argv


SHIM_UNIT_TEMPLATE = """\
# kubegpu CRI shim: kubelet talks CRI to this socket, the shim forwards to containerd and
# applies the scheduler's device allocation to CreateContainer. See docs/crishim.md.
[Unit]
Description=kubegpu CRI shim (device-aware proxy between kubelet and containerd)
Documentation=file:///usr/share/doc/kubegpu/crishim.md
After=containerd.service
Requires=containerd.service
Before=kubelet.service

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec_start}
Restart=always
RestartSec=1
# The drain window plus a margin; SIGKILL after that.
TimeoutStopSec=20
KillMode=mixed
RuntimeDirectory=kubegpu
RuntimeDirectoryMode=0755
RuntimeDirectoryPreserve=yes
# kubelet restarts pods through this socket: never let the OOM killer pick the shim first.
OOMScoreAdjust=-500
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
"""

DEVICES_DROPIN_TEMPLATE = """\
# Written by `kubegpu node install` (docs/install.md): the shim with device allocation{advertiser}.
[Service]
ExecStart=
ExecStart={exec_start}
"""

NRI_DROPIN_TEMPLATE = """\
# Written by `kubegpu node install --front nri` (docs/install.md): the node agent as containerd's
# NRI plugin{advertiser} (docs/nri.md). Nothing is on kubelet's call path: kubelet talks to
# containerd, which calls the agent once per container and, as its config requires the plugin,
# creates no container while the agent is away. This replaces the unit's CRI proxy command line.
[Unit]
Description=kubegpu node agent (containerd NRI plugin applying the scheduler's device allocation)

[Service]
ExecStart=
ExecStart={exec_start}
"""

KUBELET_DROPIN_TEMPLATE = """\
# Points kubelet's CRI client at the kubegpu shim instead of containerd.
# The ExecStart below is kubelet's own with $KUBEGPU_KUBELET_ARGS appended: kubeadm's here,
# the node's own where `kubegpu node install` writes it; command-line flags win over the config file.
[Unit]
After=kubegpu-crishim.service
Requires=kubegpu-crishim.service

[Service]
Environment="KUBEGPU_KUBELET_ARGS=--container-runtime-endpoint={listen} --image-service-endpoint={listen}"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart={kubelet}
"""
# kubeadm's kubelet command line, with kubegpu's flags last (the last occurrence of a flag wins).
KUBELET_EXEC = (
    "/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS "
    "$KUBELET_EXTRA_ARGS $KUBEGPU_KUBELET_ARGS"
)


def shim_unit_text(settings: NodeSettings) -> str:
    """The shim's unit: systemd/kubegpu-crishim.service, with this node's sockets."""
    return SHIM_UNIT_TEMPLATE.format(exec_start=_continued(shim_argv(settings, with_devices=False)))


def devices_dropin_text(settings: NodeSettings) -> str | None:
    """The drop-in that turns on device allocation (None without device plugins, or for the NRI
    front, whose drop-in is ``nri_dropin_text``)."""
    if not settings.plugins or settings.front == "nri":
        return None
    advertiser = " and the advertiser" if settings.advertise else ""
    return DEVICES_DROPIN_TEMPLATE.format(
        advertiser=advertiser, exec_start=_continued(shim_argv(settings, with_devices=True))
    )


def nri_dropin_text(settings: NodeSettings) -> str:
    """systemd/kubegpu-crishim.service.d/30-nri.conf: the agent as containerd's NRI plugin."""
    advertiser = " with the advertiser" if settings.advertise else ""
    return NRI_DROPIN_TEMPLATE.format(
        advertiser=advertiser, exec_start=_continued(shim_argv(settings, with_devices=True))
    )


def kubelet_dropin_text(settings: NodeSettings, kubelet_exec: str | None = None) -> str:
    """systemd/kubelet.service.d/20-kubegpu-crishim.conf, with this node's shim socket.

    ``kubelet_exec`` is kubelet's own ExecStart on this node (kubelet_exec_start): the drop-in
    runs that command line with the shim's flags appended. None (no kubelet unit found): kubeadm's."""
    command = KUBELET_EXEC if kubelet_exec is None else f"{kubelet_exec} $KUBEGPU_KUBELET_ARGS"
    return KUBELET_DROPIN_TEMPLATE.format(listen=settings.listen, kubelet=command)


def unit_exec_starts(text: str, current: list[str]) -> list[str]:
    """The ExecStart= list after a unit file or drop-in with ``text`` is applied to ``current``
    (systemd's rules: an empty assignment resets the list, others append; continuation lines
    joined; comments and other sections ignored)."""
    commands = list(current)
    section = ""
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        key, sep, value = line.partition("=")
        if section == "[Service]" and sep and key.strip() == "ExecStart":
            value = " ".join(value.split())
            commands = commands + [value] if value else []
    return commands


def kubelet_exec_start(root: Path, include_ours: bool = False) -> str | None:
    """kubelet's ExecStart as systemd would run it from the units under ``root``, without
    kubegpu's drop-in (with it: ``include_ours``); None when no kubelet.service is there.

    InstallError when the units leave kubelet with no command line or several."""
    unit_dirs = [directory.parent for directory in KUBELET_DROPIN_DIRS]
    units = [root / d / "kubelet.service" for d in unit_dirs]
    unit = next((path for path in units if path.is_file()), None)
    if unit is None:
        return None
    commands = unit_exec_starts(unit.read_text(errors="replace"), [])
    dropins: dict[str, Path] = {}
    for directory in KUBELET_DROPIN_DIRS:  # a name in an earlier directory masks the same name later
        if (root / directory).is_dir():
            for path in (root / directory).glob("*.conf"):
                dropins.setdefault(path.name, path)
    for name, path in sorted(dropins.items()):
        if name == KUBELET_DROPIN.name and not include_ours:
            continue
        commands = unit_exec_starts(path.read_text(errors="replace"), commands)
    if len(commands) != 1:
        raise InstallError(
            f"kubelet.service under {root} has {len(commands)} ExecStart= command lines after its "
            "drop-ins; kubegpu's drop-in appends its flags to exactly one"
        )
    return commands[0]


# ---------------------------------------------------------------------------------- validation


def socket_path(endpoint: str) -> str:
    """The path of a ``unix://`` endpoint (a bare absolute path is taken as one)."""
    path = endpoint.removeprefix("unix://")
    if not path.startswith("/") or "://" in path:
        raise InstallError(f"{endpoint!r}: want a unix socket, unix:///path or /path")
    return path


def check_value(what: str, value: str) -> str:
    if not SAFE_VALUE.match(value):
        raise InstallError(
            f"{what} {value!r}: only letters, digits and _@:/.,+=-[] are allowed in a unit file"
        )
    return value


def check_settings(settings: NodeSettings) -> None:
    """InstallError unless every value is one a unit file reads as written and every path install
    writes under (or names in a unit) stays under --root. Install's options and the record's
    settings are checked alike."""
    values = [
        ("--listen", settings.listen),
        ("--containerd-socket", settings.runtime_endpoint),
        ("--metrics-address", settings.metrics_address),
        ("--keys-dir", settings.keys_dir),
        ("--kubeconfig", settings.kubeconfig),
        ("--kubegpu-binary", settings.binary),
        ("--node-name", settings.node_name or "x"),
        ("--sim-topology", settings.sim_topology or "x"),
        ("--sim-state-dir", settings.sim_state_dir or "x"),
        ("--front", settings.front),
        ("--nri-plugin-name", settings.nri_plugin_name),
        ("--nri-plugin-index", settings.nri_plugin_index),
        ("containerd's NRI socket_path", settings.nri_socket),
        ("--containerd-config", settings.containerd_config),
        ("--cni-bin-dir", settings.cni_bin_dir or "/x"),
        ("--cni-binary", settings.cni_binary),
        ("--cni-conf-dir", settings.cni_conf_dir),
    ]
    for what, value in [*values, *(("--device-plugin", plugin) for plugin in settings.plugins)]:
        if not isinstance(value, str):
            raise InstallError(f"{what} {value!r}: not a string")
        check_value(what, value)
    socket_path(settings.listen)
    if settings.front not in FRONTS:
        raise InstallError(f"--front {settings.front!r}: want one of {', '.join(FRONTS)}")
    if not cliargs.DNS_SUBDOMAIN.match(settings.nri_plugin_name) or len(settings.nri_plugin_name) > 253:
        raise InstallError(f"--nri-plugin-name {settings.nri_plugin_name!r}: not a DNS subdomain")
    if not (len(settings.nri_plugin_index) == 2 and settings.nri_plugin_index.isdigit()):
        raise InstallError(f"--nri-plugin-index {settings.nri_plugin_index!r}: want two digits")
    socket_path(settings.nri_socket)
    absolute = (settings.keys_dir, settings.binary, settings.containerd_config)
    if not all(path.startswith("/") for path in absolute):
        raise InstallError("--keys-dir, --kubegpu-binary and --containerd-config must be absolute paths")
    cni = (settings.cni_bin_dir or "/x", settings.cni_binary, settings.cni_conf_dir)
    if not all(path.startswith("/") for path in cni):
        raise InstallError("--cni-bin-dir, --cni-binary and --cni-conf-dir must be absolute paths")
    for what, value in (
        ("--keys-dir", settings.keys_dir),
        ("--kubeconfig", settings.kubeconfig),
        ("--kubegpu-binary", settings.binary),
        ("--containerd-config", settings.containerd_config),
        ("--cni-bin-dir", settings.cni_bin_dir or "/x"),
        ("--cni-binary", settings.cni_binary),
        ("--cni-conf-dir", settings.cni_conf_dir),
    ):
        if any(part in (".", "..") for part in value.split("/")):
            raise InstallError(f"{what} {value!r}: no '.' or '..' components (it must stay under --root)")


def validate_key(key_id: str, data: bytes) -> bytes:
    """The key file's bytes, or InstallError: a valid id and an Ed25519 *public* key in one of
    the key file formats (docs/allocation.md). A node holds only public keys: the shim refuses
    a private key there, so install refuses it first."""
    from kubegpu.allocation import MAX_KEY_FILE_BYTES, KeyFileError, SigningKey, parse_key

    if not KEY_ID.match(key_id):
        raise InstallError(f"key id {key_id!r}: want letters, digits, '_', '.', '-' (at most 63)")
    if len(data) > MAX_KEY_FILE_BYTES:
        raise InstallError(
            f"key {key_id}: {len(data)} bytes is not a key file (at most {MAX_KEY_FILE_BYTES})"
        )
    try:
        key = parse_key(data)
    except KeyFileError as exc:
        raise InstallError(f"key {key_id}: {exc}") from None
    if isinstance(key, SigningKey):
        raise InstallError(
            f"key {key_id} is a private key; a node holds only the public key (kubegpu keys public)"
        )
    return data


def read_key(source: str, stdin: BinaryIO) -> bytes:
    """The key file's bytes ('-': ``stdin``): a regular file, at most a key file's size."""
    from kubegpu.allocation import MAX_KEY_FILE_BYTES
    from kubegpu.inputfiles import read_bounded, read_input

    try:
        if source == "-":
            return read_bounded(stdin, MAX_KEY_FILE_BYTES, "standard input")
        return read_input(source, MAX_KEY_FILE_BYTES)
    except OSError as exc:
        raise InstallError(f"cannot read the key file {source}: {exc.strerror or exc}") from None


def cri_version(endpoint: str, timeout: float = 5.0) -> tuple[str, str, str]:
    """(runtime name, runtime version, CRI API version) from the CRI Version call at ``endpoint``."""
    import grpc

    from crishim.cri import api_pb2, api_pb2_grpc

    with grpc.insecure_channel("unix:" + socket_path(endpoint)) as channel:
        stub = api_pb2_grpc.RuntimeServiceStub(channel)
        reply = stub.Version(api_pb2.VersionRequest(version="v1"), timeout=timeout)
    return reply.runtime_name, reply.runtime_version, reply.runtime_api_version


def check_runtime(endpoint: str, listen: str) -> tuple[str, str]:
    """The runtime at ``endpoint`` is a socket that answers CRI v1: (its name, its version)."""
    import grpc

    path = socket_path(endpoint)
    if os.path.realpath(path) == os.path.realpath(socket_path(listen)):
        raise InstallError(f"the runtime endpoint {endpoint} is the shim's own socket")
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InstallError(
            f"no containerd socket at {path} ({exc.strerror}): is containerd running? "
            "(--containerd-socket names another)"
        ) from None
    if not stat.S_ISSOCK(mode):
        raise InstallError(f"{path} is not a socket")
    try:
        name, version, api = cri_version(endpoint)
    except grpc.RpcError as exc:
        raise InstallError(
            f"{path} does not answer the CRI v1 Version call: {exc.code().name} {exc.details()} "
            "(is containerd's CRI plugin enabled?)"
        ) from None
    if api != "v1":
        raise InstallError(f"{path}: {name} {version} speaks CRI {api!r}; the shim needs v1")
    return name, version


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a runtime version as CRI reports it ("v2.2.9", "1.6.20~ds1"); None if unreadable."""
    match = re.match(r"^v?(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_nri_runtime(name: str, version: str) -> None:
    """InstallError unless the runtime is a containerd with NRI's default validator, the setting
    that makes the NRI front fail closed (containerd 2.0 and 2.1 have NRI but not that validator:
    they would ignore required_plugins and create containers while the agent is away)."""
    want = ".".join(map(str, NRI_MIN_CONTAINERD))
    found = release(version)
    if name != "containerd" or found is None or found < NRI_MIN_CONTAINERD:
        raise InstallError(
            f"the runtime is {name} {version}: --front nri needs containerd {want} or later (its NRI "
            "default validator's required_plugins is how the node fails closed while the agent is "
            f"away); use the CRI front (leave --front out) or upgrade containerd to {want} or later"
        )


def kubelet_dropin_conflicts(root: Path, ours: Sequence[str], recorded: set[str]) -> list[str]:
    """Why the kubelet drop-ins under ``root`` would fight ours (empty: no conflict). ``ours``:
    the texts of our drop-in that an unrecorded file may hold and still be adopted."""
    problems = []
    ours_path = root / KUBELET_DROPIN
    if (
        ours_path.exists()
        and str(KUBELET_DROPIN) not in recorded
        and ours_path.read_text(errors="replace") not in ours
    ):
        problems.append(
            f"/{KUBELET_DROPIN} exists, was not written by `kubegpu node install` and differs "
            "from what it writes; move it away (or run `kubegpu node uninstall` if it is ours)"
        )
    seen: set[str] = set()
    for directory in KUBELET_DROPIN_DIRS:
        base = root / directory
        if not base.is_dir():
            continue
        for path in sorted(base.glob("*.conf")):
            if path.name in seen or path.name == KUBELET_DROPIN.name:
                seen.add(path.name)
                continue
            seen.add(path.name)
            text = path.read_text(errors="replace")
            settings = [
                line.strip() for line in text.splitlines() if not line.lstrip().startswith(("#", ";"))
            ]
            where = f"/{directory}/{path.name}"
            if any(
                "container-runtime-endpoint" in line or "image-service-endpoint" in line for line in settings
            ):
                problems.append(
                    f"{where} already sets kubelet's runtime endpoint; kubegpu's drop-in would "
                    "fight it: remove that setting (or the file) first"
                )
            elif path.name > KUBELET_DROPIN.name and any(line.startswith("ExecStart=") for line in settings):
                problems.append(
                    f"{where} sorts after kubegpu's drop-in and sets ExecStart=, which would drop "
                    "kubegpu's flags: rename it to sort before 20-kubegpu-crishim.conf or remove it"
                )
    return problems


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def trust_problems(root: Path, settings: NodeSettings) -> list[str]:
    """What someone other than root could change among what the shim trusts (the rule of
    ``kubegpu.allocation.load_keys``): /etc/kubegpu and the record in it, the keys directory and
    the directories above it (under ``root``), and every key file there."""
    from kubegpu.allocation import path_problems, writers_problem

    keys_dir = root / settings.keys_dir.lstrip("/")
    problems = path_problems(root / RECORD.parent, below=root) + path_problems(keys_dir, below=root)
    entries = [root / RECORD]
    if keys_dir.is_dir():
        entries += sorted(p for p in keys_dir.iterdir() if KEY_ID.match(p.name))
    for entry in entries:
        try:
            link = os.lstat(entry)
            if stat.S_ISLNK(link.st_mode) and link.st_uid != 0:
                problems.append(f"{entry} is a symlink owned by uid {link.st_uid}, not root")
            problem = writers_problem(entry, os.stat(entry))
        except OSError:
            continue
        if problem:
            problems.append(problem)
    return list(dict.fromkeys(problems))


TRUST_FIX = (
    "only root may write what the shim trusts: check that nothing there was planted, then "
    "chown root:root and chmod go-w it (or move it away)"
)


# ------------------------------------------------------------------------------- the record


@dataclass
class Record:
    """What install wrote: files (path under root -> sha256 of the bytes written), directories it
    created, and the settings."""

    settings: NodeSettings = field(default_factory=NodeSettings)
    files: dict[str, str] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    version: str = __version__
    # Only while an install is under way (written before its first file, dropped by its last
    # step): the digests a file may still hold from before (an earlier install's bytes), so an
    # install killed half-way leaves a record that names everything it may have written.
    pending: dict[str, list[str]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "version": self.version,
            "settings": self.settings.to_json(),
            "files": dict(sorted(self.files.items())),
            "dirs": sorted(set(self.dirs)),
        }
        if self.pending:
            doc["pending"] = {rel: sorted(set(d)) for rel, d in sorted(self.pending.items())}
        return (json.dumps(doc, indent=2) + "\n").encode()

    def ours(self, rel: str, digest: str) -> bool:
        """Whether a file at ``rel`` holding bytes with ``digest`` is as install wrote it."""
        return digest == self.files.get(rel) or digest in self.pending.get(rel, ())


def read_record(root: Path) -> Record | None:
    """The install record under ``root``, None if there is none; InstallError if it cannot be read
    or names anything install would refuse (``check_record``)."""
    path = root / RECORD
    try:
        doc = json.loads(path.read_text())
        record = Record(
            NodeSettings.from_json(doc["settings"]),
            dict(doc["files"]),
            list(doc.get("dirs", [])),
            str(doc.get("version", "")),
            {rel: list(digests) for rel, digests in dict(doc.get("pending", {})).items()},
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        # AttributeError: a part of another JSON type; RecursionError: nested too deep to decode
        raise InstallError(f"/{RECORD} is unreadable ({exc}); move it away to start over") from None
    try:
        check_record(root, record)
    except InstallError as exc:
        raise InstallError(
            f"/{RECORD} names a path outside --root or a value install refuses ({exc}): it was damaged "
            "or tampered with, so nothing was changed; check it, or move it away to start over"
        ) from None
    return record


def check_record(root: Path, record: Record) -> None:
    """InstallError unless the record is one install could have written: its settings pass
    ``check_settings``, and every path in it (files, directories, pending files) is relative,
    has no empty, '.' or '..' component, and resolves (through symlinks) inside ``root``."""
    check_settings(record.settings)
    digests = [*record.files.values(), *(d for ds in record.pending.values() for d in ds)]
    if not all(isinstance(d, str) for d in digests):
        raise InstallError("a digest that is not a string")
    paths = [("file", rel) for rel in (*record.files, *record.pending)] + [("dir", d) for d in record.dirs]
    for what, rel in paths:
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
            raise InstallError(f"{what} {rel!r} is not a relative path")
        if any(part in ("", ".", "..") for part in rel.split("/")):
            raise InstallError(f"{what} {rel!r} has an empty, '.' or '..' component")
        real = leaves_root(root, rel)
        if real is not None:
            raise InstallError(f"{what} {rel!r} leads outside --root, to {real} (a symlink on the way)")


# ----------------------------------------------------------------------------- writing safely


class Transaction:
    """Files and directories written under ``root``, undone in reverse order on failure."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.undo: list[Callable[[], None]] = []
        self.created_dirs: list[str] = []

    def missing(self, rel: Path) -> list[Path]:
        """The directories ``mkdir(rel)`` would create, outermost first."""
        missing = []
        for parent in [rel, *rel.parents][:-1]:
            if (self.root / parent).is_dir():
                break
            missing.append(parent)
        return list(reversed(missing))

    def mkdir(self, rel: Path, mode: int) -> None:
        for parent in self.missing(rel):
            path = self.root / parent
            path.mkdir()
            os.chmod(path, mode if parent == rel else 0o755)
            self.undo.append(lambda path=path: path.rmdir())
            self.created_dirs.append(str(parent))

    def write(self, rel: Path, data: bytes, mode: int) -> bool:
        """Write ``data`` atomically (temp file, fsync, rename); False when it was already so."""
        path = self.root / rel
        previous: bytes | None = path.read_bytes() if path.is_file() else None
        if previous == data and stat.S_IMODE(path.stat().st_mode) == mode:
            return False
        previous_mode = stat.S_IMODE(path.stat().st_mode) if previous is not None else None
        tmp = path.with_name(f".{path.name}.kubegpu-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

        def restore() -> None:
            if previous is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(previous)
                os.chmod(path, previous_mode or 0o644)

        self.undo.append(restore)
        return True

    def remove(self, rel: Path) -> None:
        path = self.root / rel
        previous = path.read_bytes()
        previous_mode = stat.S_IMODE(path.stat().st_mode)
        path.unlink()

        def restore() -> None:
            path.write_bytes(previous)
            os.chmod(path, previous_mode)

        self.undo.append(restore)

    def rollback(self) -> None:
        for step in reversed(self.undo):
            try:
                step()
            except OSError:
                pass
        self.undo.clear()


# ------------------------------------------------------------------------------------ install


@dataclass(frozen=True)
class Wanted:
    """One file install wants: path under root, bytes, mode, parent directory mode."""

    rel: Path
    data: bytes
    mode: int
    dir_mode: int = 0o755


def planned_files(
    settings: NodeSettings,
    keys: dict[str, bytes],
    kubelet_exec: str | None = None,
    containerd_dropin: tuple[str, str] | None = None,
) -> list[Wanted]:
    """The files install writes: the unit and, for the CRI front, the kubelet drop-in and the
    devices drop-in; for the NRI front, its drop-in and ``containerd_dropin`` (node path, text)
    when containerd needs one; then the keys."""
    files = [Wanted(SHIM_UNIT, shim_unit_text(settings).encode(), 0o644)]
    if settings.front == "nri":
        files.append(Wanted(SHIM_NRI_DROPIN, nri_dropin_text(settings).encode(), 0o644))
        if containerd_dropin is not None:
            path, text = containerd_dropin
            files.append(Wanted(Path(path.lstrip("/")), text.encode(), 0o644))
    else:
        files.append(Wanted(KUBELET_DROPIN, kubelet_dropin_text(settings, kubelet_exec).encode(), 0o644))
        devices = devices_dropin_text(settings)
        if devices is not None:
            files.append(Wanted(SHIM_DEVICES_DROPIN, devices.encode(), 0o644))
    if settings.cni_launcher is not None:
        files.append(Wanted(settings.cni_launcher, launcher_text(settings.cni_binary).encode(), 0o755))
    keys_dir = Path(settings.keys_dir.lstrip("/"))
    files += [Wanted(keys_dir / key_id, data, 0o600, 0o700) for key_id, data in sorted(keys.items())]
    return files


@dataclass
class InstallResult:
    written: list[str]
    unchanged: list[str]
    removed: list[str]
    runtime: str
    front: str = "cri"
    containerd_changed: bool = False  # its drop-in written or removed: containerd must restart


def is_containerd_dropin(rel: str) -> bool:
    """A recorded path that is kubegpu's containerd drop-in (containerdconfig.DROPIN_NAMES)."""
    return Path(rel).name in DROPIN_NAMES


def switch_refusal(installed: str, wanted: str) -> str:
    return (
        f"this node runs the {installed} front (/{RECORD}); switching to --front {wanted} in place is "
        "refused: the new front would rebuild its ledger without the devices running containers hold "
        "(the CRI proxy reads its marks from CRI's container list, the NRI front's are in the OCI "
        "spec), and could hand them out twice. Drain the node's GPU pods (kubectl drain), run "
        f"`kubegpu node uninstall --disable-now`, then `kubegpu node install --front {wanted} ...`"
    )


def plan_nri(
    root: Path, settings: NodeSettings, record: Record
) -> tuple[NodeSettings, tuple[str, str] | None]:
    """The NRI front's settings with containerd's NRI socket, and the containerd drop-in to write
    (None: containerd already requires the agent); InstallError with what to change otherwise."""
    ours = tuple("/" + rel for rel in record.files if is_containerd_dropin(rel))
    try:
        plan = plan_dropin(root, settings.containerd_config, settings.nri_plugin_name, ours)
    except ConfigError as exc:
        raise InstallError(f"containerd's config: {exc}") from None
    settings = replace(settings, nri_socket=plan.socket)
    check_settings(settings)  # the socket containerd's config names goes into the unit
    if plan.path is None or plan.text is None:
        return settings, None
    return settings, (plan.path, plan.text)


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """One install or uninstall at a time under ``root`` (a lock on the directory itself, so
    nothing is written for it)."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise InstallError(f"--root {root}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InstallError(f"another `kubegpu node install/uninstall` is running on {root}") from None
        yield
    finally:
        os.close(fd)


def check_cni(root: Path, settings: NodeSettings) -> None:
    """InstallError unless the CNI bin dir exists (the runtime's, not one install would invent)
    and the plugin executable the launcher runs is there: a chained plugin that cannot run fails
    every pod's sandbox on the node, not only those with VFs."""
    if settings.cni_bin_dir is None:
        return
    if not (root / settings.cni_bin_dir.lstrip("/")).is_dir():
        raise InstallError(
            f"--cni-bin-dir {settings.cni_bin_dir} is not a directory: name the one the runtime "
            "runs CNI plugins from (containerd: bin_dir, or bin_dirs in 2.x, of its CRI plugin's cni "
            "section; often /opt/cni/bin)"
        )
    binary = root / settings.cni_binary.lstrip("/")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise InstallError(
            f"--cni-binary {settings.cni_binary} is not an executable file: it is kubegpu's console "
            "script kubegpu-cni (pip install kubegpu puts it beside kubegpu)"
        )


def leaves_root(root: Path, rel: str) -> str | None:
    """Where ``rel`` (a relative path) leads when it leaves ``root`` through a symlink, else None."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, rel))
    return real if os.path.commonpath([real_root, real]) != real_root else None


def install(root: Path, settings: NodeSettings, keys: dict[str, bytes]) -> InstallResult:
    """Validate everything, then write every file or none; return what changed."""
    with locked(root):
        return _install(root, settings, keys)


def _install(root: Path, settings: NodeSettings, keys: dict[str, bytes]) -> InstallResult:
    from devices.registry import plugin_names

    for plugin in settings.plugins:
        if plugin not in plugin_names():
            raise InstallError(f"unknown device plugin {plugin!r} (known: {', '.join(plugin_names())})")
    if len(set(settings.plugins)) != len(settings.plugins):
        raise InstallError(f"device plugin listed twice: {', '.join(settings.plugins)}")
    if "sim" in settings.plugins and not settings.sim_topology:
        raise InstallError("the sim plugin needs --sim-topology")
    if settings.front == "nri" and not settings.plugins:
        raise InstallError("--front nri needs --device-plugin (the NRI agent decides nothing else)")
    check_settings(settings)
    name, version = check_runtime(settings.runtime_endpoint, settings.listen)
    runtime = f"{name} {version} (CRI v1)"
    if settings.front == "nri":
        check_nri_runtime(name, version)
    check_cni(root, settings)

    record = read_record(root) or Record()
    if (record.files or record.pending) and record.settings.front != settings.front:
        raise InstallError(switch_refusal(record.settings.front, settings.front))
    recorded = set(record.files)
    keys_dir = root / settings.keys_dir.lstrip("/")
    present = {p.name for p in keys_dir.iterdir() if KEY_ID.match(p.name)} if keys_dir.is_dir() else set()
    if settings.plugins and not keys and not present:
        raise InstallError(f"device allocation needs a signing key: --key-file (none in {settings.keys_dir})")
    if settings.advertise and not (root / settings.kubeconfig.lstrip("/")).is_file():
        raise InstallError(
            f"--advertise needs API access, and {settings.kubeconfig} does not exist: create it as "
            "docs/deploy.md ('API access') says, or pass --no-advertise"
        )
    untrusted = trust_problems(root, settings)
    if untrusted:
        raise InstallError(f"{'; '.join(untrusted)}: {TRUST_FIX}")
    if settings.front == "nri":
        if (root / KUBELET_DROPIN).exists():
            raise InstallError(
                f"/{KUBELET_DROPIN} points kubelet at the CRI shim, which the NRI front does not run "
                "(kubelet must talk to containerd): remove it first"
            )
        settings, containerd_dropin = plan_nri(root, settings, record)
        wanted = planned_files(settings, keys, None, containerd_dropin)
        problems: list[str] = []
    else:
        kubelet_exec = kubelet_exec_start(root)
        wanted = planned_files(settings, keys, kubelet_exec)
        # a copy of the shipped drop-in (installed by hand as docs/deploy.md says) is adopted and
        # rewritten for this node's kubelet command line
        adoptable = (kubelet_dropin_text(settings, kubelet_exec), kubelet_dropin_text(settings))
        problems = kubelet_dropin_conflicts(root, adoptable, recorded)
    # the other front's unit drop-in, put there by hand, would replace (30-nri.conf sorts last) or
    # shadow this front's command line
    other = SHIM_DEVICES_DROPIN if settings.front == "nri" else SHIM_NRI_DROPIN
    if (root / other).exists() and str(other) not in recorded:
        problems.append(
            f"/{other} is another front's drop-in that `kubegpu node install` did not write; it would "
            f"fight this --front {settings.front} install's command line: move it away first"
        )
    for item in wanted:
        outside = leaves_root(root, str(item.rel.parent))  # the file itself is replaced, not followed
        if outside is not None:
            where = f"{outside}/{item.rel.name}"
            problems.append(f"/{item.rel} leads outside --root, to {where} (a symlink on the way)")
            continue
        path = root / item.rel
        if not path.exists():
            continue
        if not path.is_file():
            problems.append(f"/{item.rel} exists and is not a regular file")
            continue
        current = path.read_bytes()
        if current == item.data:
            continue
        if str(item.rel) in recorded and not record.ours(str(item.rel), sha256(current)):
            problems.append(
                f"/{item.rel} was changed since `kubegpu node install` wrote it: install would "
                "throw that change away; put a systemd drop-in beside it instead, or move it away first"
            )
        elif item.rel == KUBELET_DROPIN:
            continue  # not recorded: kubelet_dropin_conflicts said what there is to say
        elif item.rel.parent == Path(settings.keys_dir.lstrip("/")) or str(item.rel) not in recorded:
            what = "a different key" if item.rel.parent == keys_dir.relative_to(root) else "something else"
            problems.append(
                f"/{item.rel} already holds {what} that `kubegpu node install` did not write: "
                "move it away first (key ids never change meaning: rotate to a new id)"
            )
    # files an earlier install wrote that this one does not want (the devices drop-in); keys stay
    keep = {str(item.rel) for item in wanted} | {
        rel for rel in record.files if Path(rel).parent == Path(record.settings.keys_dir.lstrip("/"))
    }
    stale = sorted(set(record.files) - keep)
    for rel in stale:
        path = root / rel
        if path.is_file() and not record.ours(rel, sha256(path.read_bytes())):
            problems.append(
                f"/{rel} was written by install, is no longer wanted, but changed since: "
                "remove it or restore it first"
            )
    if problems:
        raise InstallError("; ".join(problems))

    transaction = Transaction(root)
    result = InstallResult([], [], [], runtime, settings.front)
    new_files = dict(record.files)
    for item in wanted:
        new_files[str(item.rel)] = sha256(item.data)
    # Write-ahead: before the first file, a record naming every file this install may write
    # (with the digests it may still hold from before) and every directory it may create, so
    # that `uninstall` after a SIGKILL or power loss half-way still removes all of it.
    will_create = {str(d) for item in wanted for d in transaction.missing(item.rel.parent)}
    pending = {
        rel: sorted({record.files[rel], *record.pending.get(rel, ())} - {new_files[rel]})
        for rel in record.files
        if rel in new_files
    }
    intent = Record(
        settings,
        new_files,
        record.dirs + sorted(will_create) + [str(d) for d in transaction.missing(RECORD.parent)],
        pending={rel: digests for rel, digests in pending.items() if digests},
    )
    try:
        transaction.mkdir(RECORD.parent, 0o755)
        if intent.to_bytes() != (record.to_bytes() if (root / RECORD).exists() else None):
            transaction.write(RECORD, intent.to_bytes(), 0o644)
        for item in wanted:
            transaction.mkdir(item.rel.parent, item.dir_mode)
            changed = transaction.write(item.rel, item.data, item.mode)
            (result.written if changed else result.unchanged).append("/" + str(item.rel))
        for rel in stale:
            if (root / rel).is_file():
                transaction.remove(Path(rel))
                result.removed.append("/" + rel)
            new_files.pop(rel)
        new_record = Record(settings, new_files, record.dirs + transaction.created_dirs)
        transaction.write(RECORD, new_record.to_bytes(), 0o644)
        result.containerd_changed = any(
            is_containerd_dropin(path) for path in (*result.written, *result.removed)
        )
    except OSError as exc:
        transaction.rollback()
        raise InstallError(f"writing under {root} failed ({exc}); nothing was changed") from None
    except BaseException:
        transaction.rollback()  # Ctrl-C, SIGTERM turned into SystemExit, a bug: put everything back
        raise
    return result


SYSTEMCTL_INSTALL = (("daemon-reload",), ("enable", "--now", UNIT_NAME), ("restart", "kubelet.service"))
SYSTEMCTL_UNINSTALL_BEFORE = (("disable", "--now", UNIT_NAME),)
SYSTEMCTL_UNINSTALL_AFTER = (("daemon-reload",), ("restart", "kubelet.service"))
RESTART_CONTAINERD = ("restart", "containerd.service")


def install_steps(front: str, containerd_changed: bool) -> tuple[tuple[str, ...], ...]:
    """The systemctl steps after install. NRI: containerd first (NRI on, the plugin required), so
    that the agent can register (systemd waits for its READY=1, sent after containerd's first
    Synchronize); the agent restarted (a rewritten drop-in takes effect); kubelet untouched."""
    if front != "nri":
        return SYSTEMCTL_INSTALL
    restart = (RESTART_CONTAINERD,) if containerd_changed else ()
    return (("daemon-reload",), *restart, ("enable", UNIT_NAME), ("restart", UNIT_NAME))


def uninstall_steps_after(front: str, containerd_changed: bool) -> tuple[tuple[str, ...], ...]:
    """After the files are gone: kubelet back on containerd (CRI), or containerd no longer
    requiring the stopped agent (NRI: until it restarts it creates no container at all)."""
    if front != "nri":
        return SYSTEMCTL_UNINSTALL_AFTER
    return (("daemon-reload",), *((RESTART_CONTAINERD,) if containerd_changed else ()))


def systemd_running(root: Path) -> bool:
    return root == Path("/") and Path("/run/systemd/system").is_dir()


def run_systemctl(steps: Iterable[Sequence[str]]) -> None:
    for step in steps:
        result = subprocess.run(["systemctl", *step], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise InstallError(f"systemctl {' '.join(step)} failed: {result.stderr.strip()}")


# ---------------------------------------------------------------------------------- uninstall


@dataclass
class UninstallResult:
    removed: list[str]
    kept: list[str]
    missing: list[str]
    front: str = "cri"
    containerd_changed: bool = False  # its drop-in removed: containerd must restart


def uninstall(root: Path, before: Callable[[], None] | None = None) -> UninstallResult | None:
    """Remove what the record lists, where still as written; None when nothing was installed.
    ``before`` (stopping the shim) runs under the lock, once there is a record to act on."""
    with locked(root):
        if before is not None and read_record(root) is not None:
            before()
        return _uninstall(root)


def _uninstall(root: Path) -> UninstallResult | None:
    record = read_record(root)
    if record is None:
        return None
    result = UninstallResult([], [], [], record.settings.front)
    for rel in sorted(record.files):
        path = root / rel
        if not path.is_file():
            result.missing.append("/" + rel)
        elif not record.ours(rel, sha256(path.read_bytes())):
            result.kept.append("/" + rel)
        else:
            path.unlink()
            result.removed.append("/" + rel)
            result.containerd_changed |= is_containerd_dropin(rel)
    (root / RECORD).unlink()
    for rel in sorted(set(record.dirs), key=lambda d: d.count("/"), reverse=True):
        try:
            (root / rel).rmdir()
        except OSError:
            pass  # not empty (something else lives there) or already gone
    return result


# -------------------------------------------------------------------------------------- check


@dataclass
class Finding:
    ok: bool | None  # None: not applicable
    what: str
    detail: str


def kubelet_pids(proc: Path = Path("/proc")) -> list[int]:
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        if os.path.basename(argv0) == b"kubelet":
            pids.append(int(entry.name))
    return sorted(pids)


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value  # the last one wins, as for kubelet's flags


def kubelet_endpoint(argv: Sequence[str], cwd: Path | None = None) -> tuple[str, str]:
    """(runtime endpoint, where it came from) of a kubelet command line, as kubelet reads it:
    the flag, else the last ``--config-dir`` drop-in (``*.conf``, by name) that sets it, else the
    ``--config`` file, else the default. Relative paths are kubelet's: under its ``cwd``."""
    import yaml

    value = flag_value(argv, "--container-runtime-endpoint")
    if value:
        return value, "--container-runtime-endpoint"
    base = cwd or Path.cwd()
    files: list[Path] = []
    config = flag_value(argv, "--config")
    if config:
        files.append(base / config)
    config_dir = flag_value(argv, "--config-dir")
    if config_dir:
        try:
            files += sorted((base / config_dir).glob("*.conf"))
        except OSError:
            pass
    found = None
    for path in files:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            return "", f"its config {path} is unreadable ({exc})"
        if isinstance(doc, dict) and doc.get("containerRuntimeEndpoint"):
            found = str(doc["containerRuntimeEndpoint"]), f"containerRuntimeEndpoint in {path}"
    return found or (DEFAULT_RUNTIME, "kubelet's default")


def same_socket(a: str, b: str) -> bool:
    try:
        return os.path.realpath(socket_path(a)) == os.path.realpath(socket_path(b))
    except InstallError:
        return False


def find_kubelet(pid: int | None) -> tuple[int, str, str] | Finding:
    """(pid, runtime endpoint, where it came from) of the running kubelet, or why not (a Finding)."""
    pids = [pid] if pid is not None else kubelet_pids()
    if not pids:
        return Finding(False, "kubelet", "no kubelet process found")
    if len(pids) > 1:
        return Finding(
            False, "kubelet", f"several kubelet processes ({', '.join(map(str, pids))}): pass --kubelet-pid"
        )
    try:
        argv = [
            a.decode(errors="replace")
            for a in Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")
            if a
        ]
    except OSError as exc:
        return Finding(False, "kubelet", f"pid {pids[0]}: {exc.strerror}")
    try:
        cwd: Path | None = Path(os.readlink(f"/proc/{pids[0]}/cwd"))
    except OSError:
        cwd = None
    endpoint, source = kubelet_endpoint(argv, cwd)
    return pids[0], endpoint, source


def check_kubelet(settings: NodeSettings, pid: int | None) -> Finding:
    return kubelet_finding(settings, find_kubelet(pid))


def kubelet_finding(settings: NodeSettings, kubelet: tuple[int, str, str] | Finding) -> Finding:
    """CRI front: kubelet must talk to the shim; NRI front: to containerd itself."""
    if isinstance(kubelet, Finding):
        return kubelet
    pid, endpoint, source = kubelet
    if settings.front == "nri":
        if same_socket(endpoint, settings.runtime_endpoint):
            return Finding(True, "kubelet", f"pid {pid} talks to containerd ({endpoint}, {source})")
        if same_socket(endpoint, settings.listen):
            return Finding(
                False,
                "kubelet",
                f"pid {pid} talks to the CRI shim's socket {endpoint} ({source}), not to containerd "
                f"{settings.runtime_endpoint}: the NRI front needs kubelet on containerd (remove the "
                "setting that points it at the shim, restart kubelet)",
            )
        return Finding(
            False,
            "kubelet",
            f"pid {pid} talks to {endpoint or '?'} ({source}), not to containerd {settings.runtime_endpoint}",
        )
    if same_socket(endpoint, settings.listen):
        return Finding(True, "kubelet", f"pid {pid} talks to the shim ({endpoint}, {source})")
    return Finding(
        False,
        "kubelet",
        f"pid {pid} talks to {endpoint or '?'} ({source}), not to the shim "
        f"{settings.listen}: restart kubelet after install",
    )


NRI_READY = "registered with containerd"  # the NRI agent's /readyz while registered (crishim/nri/serve.py)


def front_finding(
    settings: NodeSettings, kubelet: tuple[int, str, str] | Finding, ready: bool, ready_detail: str
) -> Finding:
    """Which front is live: the CRI proxy when kubelet's endpoint is the shim, the NRI front when
    the agent's /readyz says it is registered with containerd. Ok when the installed one is."""
    endpoint = "" if isinstance(kubelet, Finding) else kubelet[1]
    live = {
        "cri": bool(endpoint) and same_socket(endpoint, settings.listen),
        "nri": ready and ready_detail == NRI_READY,
    }
    if live[settings.front]:
        if settings.front == "nri":
            return Finding(
                True,
                "front",
                f"NRI: the agent is registered with containerd as {settings.nri_plugin_name} "
                f"(index {settings.nri_plugin_index}, /readyz)",
            )
        return Finding(True, "front", f"CRI proxy: kubelet's endpoint is the shim ({settings.listen})")
    names = {"cri": "the CRI proxy (kubelet's endpoint is the shim)", "nri": "the NRI front (/readyz)"}
    other = [names[front] for front, on in live.items() if on]
    if other:
        installed = f"this node is installed for --front {settings.front}"
        return Finding(False, "front", f"{' and '.join(other)} is live, but {installed}")
    kubelet_says = f"kubelet talks to {endpoint}" if endpoint else "no kubelet endpoint read"
    return Finding(
        False,
        "front",
        f"no front is live: {kubelet_says}, not the shim, and no agent is {NRI_READY} "
        f"(/readyz: {ready_detail or '?'})",
    )


def http_probe(address: str, path: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=3) as reply:
            return reply.status == 200, reply.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        return False, exc.read().decode(errors="replace").strip() or str(exc.code)
    except (OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", exc))


def probes(settings: NodeSettings) -> tuple[bool, str, bool, str]:
    """(/healthz ok, its body, /readyz ok, its body) from the agent's metrics address; /readyz is
    asked up to READY_TRIES times (the shim connects to the runtime lazily, the NRI agent
    registers with backoff)."""
    health, health_detail = http_probe(settings.metrics_address, "/healthz")
    for attempt in range(READY_TRIES):
        ready, ready_detail = http_probe(settings.metrics_address, "/readyz")
        if ready or not health or attempt == READY_TRIES - 1:
            break
        time.sleep(0.5)
    return health, health_detail, ready, ready_detail


def check_containerd_nri(root: Path, settings: NodeSettings) -> Finding:
    """containerd's version (CRI Version) and its NRI settings as its config and imports say
    (read from disk: containerd uses them once restarted): NRI on at the agent's socket, the
    agent's name required by the default validator, nothing tolerating its absence."""
    import grpc

    from kubegpu.containerdconfig import ContainerdConfig

    what = "containerd NRI"
    try:
        name, version, _ = cri_version(settings.runtime_endpoint)
    except grpc.RpcError as exc:
        return Finding(False, what, f"{settings.runtime_endpoint}: {exc.code().name} {exc.details()}")
    except InstallError as exc:
        return Finding(False, what, str(exc))
    try:
        view: ContainerdConfig = read_containerd_config(root, settings.containerd_config)
    except ConfigError as exc:
        return Finding(False, what, f"{name} {version}: its config: {exc}")
    plugin = settings.nri_plugin_name
    problems = []
    found = release(version)
    if name != "containerd" or found is None or found < NRI_MIN_CONTAINERD:
        problems.append(f"{name} {version} has no NRI default validator (needs containerd 2.2+)")
    if not view.nri_enabled:
        where = ", ".join(view.disabled_by) or view.where("disable")
        problems.append(f"NRI is off ({where})")
    if not view.connections_allowed:
        problems.append(f"disable_connections = true ({view.where('disable_connections')})")
    if view.socket != settings.nri_socket:
        problems.append(f"its NRI socket is {view.socket}, the agent's {settings.nri_socket}")
    if not view.validator_enabled or plugin not in view.required:
        problems.append(f"it does not require {plugin}: creates go ahead while the agent is away")
    if view.tolerate_annotation:
        problems.append(f"pods annotated {view.tolerate_annotation} are created without the agent")
    if problems:
        where = f" ({view.main} and its imports)"
        return Finding(False, what, f"{name} {version}: " + "; ".join(problems) + where)
    return Finding(
        True,
        what,
        f"{name} {version}: NRI on at {view.socket}, requires {plugin} (fail closed; "
        f"{view.where('default_validator.required_plugins')})",
    )


def check_shim(settings: NodeSettings) -> tuple[list[Finding], bool, str]:
    """A CRI call through the shim (which also wakes its runtime connection), then its probes.

    /readyz is asked up to READY_TRIES times: the shim connects to the runtime lazily, so the
    first answer after an idle spell can be "runtime connecting"."""
    import grpc

    try:
        name, version, api = cri_version(settings.listen)
        cri = Finding(True, "CRI via shim", f"{name} {version} (CRI {api}) through {settings.listen}")
    except grpc.RpcError as exc:
        cri = Finding(False, "CRI via shim", f"{settings.listen}: {exc.code().name} {exc.details()}")
    except InstallError as exc:
        cri = Finding(False, "CRI via shim", str(exc))
    health, health_detail, ready, ready_detail = probes(settings)
    detail = f"/healthz {health_detail}, /readyz {ready_detail} (http://{settings.metrics_address})"
    return [Finding(health and ready, "shim health", detail), cri], ready, ready_detail


def check_keys(root: Path, settings: NodeSettings) -> Finding:
    directory = root / settings.keys_dir.lstrip("/")
    if not settings.plugins:
        return Finding(None, "signing keys", "not needed (no device plugins: a plain proxy)")
    try:
        names = sorted(p.name for p in directory.iterdir() if KEY_ID.match(p.name) and p.is_file())
    except OSError as exc:
        return Finding(False, "signing keys", f"{settings.keys_dir}: {exc.strerror}")
    good, bad = [], []
    for name in names:
        path = directory / name
        try:
            validate_key(name, path.read_bytes())
        except (InstallError, OSError) as exc:
            bad.append(f"{name}: {exc}")
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        (bad.append(f"{name}: mode {mode:04o}, readable by others") if mode & 0o077 else good.append(name))
    if bad or not good:
        return Finding(False, "signing keys", "; ".join(bad) or f"no key in {settings.keys_dir}")
    return Finding(True, "signing keys", f"{', '.join(good)} in {settings.keys_dir}")


def check_devices(root: Path, settings: NodeSettings) -> Finding:
    if not settings.plugins:
        return Finding(None, "devices", "no device plugins (a plain proxy)")
    node = settings.node_name or socket.gethostname()
    kubeconfig = root / settings.kubeconfig.lstrip("/")
    if settings.advertise and kubeconfig.is_file():
        return published_devices(str(kubeconfig), node)
    from devices.plugin import PluginError, discover_all
    from devices.registry import load_plugins

    try:
        plugins = load_plugins(
            settings.plugins,
            {"node_name": node, "topology": settings.sim_topology, "state_dir": settings.sim_state_dir},
        )
        inventory = discover_all(plugins)
    except PluginError as exc:
        return Finding(False, "devices", f"discovery failed: {exc}")
    return Finding(
        bool(inventory.devices),
        "devices",
        f"{describe(d.kind.value for d in inventory.devices)} "
        f"discovered here by {', '.join(settings.plugins)}",
    )


def cni_findings(root: Path, settings: NodeSettings, record: Record) -> list[Finding]:
    """The CNI plugin (the launcher as install wrote it, the executable it runs answering VERSION)
    and its chain (the network config the runtime loads chains it as docs/cni.md shows).

    The executable is run only when only root could have chosen and written it: the record that
    names it, the executable and the directories above each are root's alone
    (``kubegpu.allocation.path_problems``); otherwise check would run, as root, what another user
    put there."""
    from kubegpu.allocation import path_problems

    launcher = settings.cni_launcher
    assert launcher is not None
    path = root / launcher
    binary = root / settings.cni_binary.lstrip("/")
    writers = path_problems(root / RECORD, below=root) or path_problems(binary, below=root)
    if not path.is_file():
        plugin = Finding(False, "CNI plugin", f"/{launcher} is missing: run `kubegpu node install` again")
    elif not record.ours(str(launcher), sha256(path.read_bytes())):
        plugin = Finding(False, "CNI plugin", f"/{launcher} was changed since install")
    elif writers:
        plugin = Finding(
            False,
            "CNI plugin",
            f"{settings.cni_binary} not run: {writers[0]} (the runtime runs it as root for every pod; "
            "only root may write it and the record that names it)",
        )
    else:
        versions = plugin_versions(binary)
        plugin = (
            Finding(False, "CNI plugin", versions)
            if isinstance(versions, str)
            else Finding(
                True, "CNI plugin", f"/{launcher} runs {settings.cni_binary} (CNI {', '.join(versions)})"
            )
        )
    where, problems = chain_status(root, settings.cni_conf_dir, settings.node_name, settings.keys_dir)
    if problems:
        return [plugin, Finding(False, "CNI chain", f"{where}: {'; '.join(problems)}: {CHAIN_FIX}")]
    return [plugin, Finding(True, "CNI chain", f"{where} chains kubegpu-cni after the primary network")]


CHAIN_FIX = "pods get no RDMA VFs; chain it as docs/cni.md shows (install prints the stanza)"


def describe(kinds: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no devices"


def published_devices(kubeconfig: str, node: str) -> Finding:
    from kubernetes import client
    from kubernetes.config import new_client_from_config

    from kubegpu.nodeannotations import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION

    try:
        api = new_client_from_config(config_file=kubeconfig)
        with api:
            annotations = client.CoreV1Api(api).read_node(node, _request_timeout=5).metadata.annotations or {}
    except Exception as exc:  # noqa: BLE001 - any API failure is a finding, never a crash
        return Finding(
            False, "devices", f"cannot read Node {node} with {kubeconfig}: {str(exc).splitlines()[0]}"
        )
    try:
        devices = json.loads(annotations[INVENTORY_ANNOTATION])["devices"]
        kinds = [str(d.get("kind", "?")) for d in devices]
    except (KeyError, ValueError, TypeError, AttributeError):
        return Finding(
            False, "devices", f"Node {node} has no readable {INVENTORY_ANNOTATION}: is the shim advertising?"
        )
    beat = annotations.get(HEARTBEAT_ANNOTATION, "never")
    return Finding(bool(devices), "devices", f"{describe(kinds)} published on Node {node} (heartbeat {beat})")


def check(root: Path, kubelet_pid: int | None) -> tuple[list[Finding], Record | None]:
    record = read_record(root)
    settings = record.settings if record else NodeSettings()
    findings = [
        Finding(
            record is not None,
            "installed",
            f"kubegpu {record.version}, front {settings.front}, "
            f"plugins: {', '.join(settings.plugins) or 'none'}"
            if record
            else f"no /{RECORD}: not installed by `kubegpu node install` (checking the defaults)",
        )
    ]
    kubelet = find_kubelet(kubelet_pid)
    if settings.front == "nri":
        health, health_detail, ready, ready_detail = probes(settings)
        findings.append(front_finding(settings, kubelet, ready, ready_detail))
        findings.append(kubelet_finding(settings, kubelet))
        detail = f"/healthz {health_detail}, /readyz {ready_detail} (http://{settings.metrics_address})"
        findings.append(Finding(health and ready and ready_detail == NRI_READY, "agent health", detail))
        findings.append(check_containerd_nri(root, settings))
    else:
        shim, ready, ready_detail = check_shim(settings)
        findings.append(front_finding(settings, kubelet, ready, ready_detail))
        findings.append(kubelet_finding(settings, kubelet))
        findings += shim
    untrusted = trust_problems(root, settings)
    findings.append(
        Finding(
            not untrusted,
            "owners",
            "; ".join(untrusted) + f": {TRUST_FIX}"
            if untrusted
            else f"/{RECORD.parent}, {settings.keys_dir} and its keys: root's alone",
        )
    )
    findings.append(check_keys(root, settings))
    findings.append(check_devices(root, settings))
    if record is not None and settings.cni_launcher is not None:
        findings += cni_findings(root, settings, record)
    return findings, record


VERDICTS = {
    "cri": "kubelet talks to a working shim",
    "nri": "containerd calls a working NRI agent (fail closed)",
}


def render_findings(findings: Sequence[Finding], front: str = "cri") -> str:
    marks = {True: "ok  ", False: "FAIL", None: " -- "}
    width = max(len(f.what) for f in findings)
    lines = [f"  [{marks[f.ok]}] {f.what.ljust(width)}  {f.detail}" for f in findings]
    failed = sum(1 for f in findings if f.ok is False)
    verdict = VERDICTS.get(front, VERDICTS["cri"]) if not failed else f"{failed} problem(s)"
    return "\n".join(["kubegpu node check", *lines, verdict])


# ---------------------------------------------------------------------------------------- CLI


def register(sub: argparse._SubParsersAction) -> None:
    node = sub.add_parser(
        "node",
        help="install, remove or check the node agent on this GPU node",
        description="Set up this node's kubegpu agent (the CRI shim) as docs/install.md says.",
    )
    actions = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", type=Path, default=Path("/"), help="work under this directory (default: /)")

    inst = actions.add_parser(
        "install", parents=[common], help="write the units, the kubelet drop-in, the key"
    )
    inst.add_argument(
        "--containerd-socket",
        default=DEFAULT_RUNTIME,
        type=cliargs.unix_endpoint,
        metavar="PATH",
        help="containerd's CRI socket (default: %(default)s)",
    )
    inst.add_argument(
        "--device-plugin",
        action="append",
        default=[],
        type=cliargs.one_of(_plugin_names, "device plugin"),
        metavar="NAME",
        help="device plugin for the shim (repeatable): nvidia, rdma, sim",
    )
    inst.add_argument("--key-id", default="k1", help="the signing key's id (default: %(default)s)")
    inst.add_argument("--key-file", metavar="PATH|-", help="the signing key's bytes, '-' for stdin")
    inst.add_argument(
        "--kubeconfig",
        default=DEFAULT_KUBECONFIG,
        help="the node agent's API access, for the advertiser (default: %(default)s)",
    )
    inst.add_argument("--no-advertise", action="store_true", help="do not publish devices on the Node")
    inst.add_argument(
        "--node-name", type=cliargs.node_name, help="this node's name in Kubernetes (default: the hostname)"
    )
    inst.add_argument("--sim-topology", help="sim plugin: topology file or shipped name")
    inst.add_argument("--sim-state-dir", help="sim plugin: where its stand-in device nodes live")
    inst.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        type=cliargs.unix_endpoint,
        help="the shim's socket (default: %(default)s)",
    )
    inst.add_argument(
        "--metrics-address",
        default=DEFAULT_METRICS,
        type=cliargs.listen_address,
        help="the shim's metrics (default: %(default)s)",
    )
    inst.add_argument("--keys-dir", default=DEFAULT_KEYS_DIR, help="(default: %(default)s)")
    inst.add_argument(
        "--front",
        choices=FRONTS,
        default="cri",
        help="cri: the agent as a CRI proxy kubelet talks to; nri: as containerd's NRI plugin, kubelet "
        "staying on containerd (needs containerd 2.2+ and --device-plugin; docs/nri.md) "
        "(default: %(default)s)",
    )
    inst.add_argument(
        "--nri-plugin-name",
        default="kubegpu",
        type=cliargs.dns_subdomain,
        help="--front nri: the agent's plugin name, which containerd requires (default: %(default)s)",
    )
    inst.add_argument(
        "--nri-plugin-index",
        default="10",
        type=cliargs.two_digits,
        help="--front nri: the agent's two-digit place among NRI plugins (default: %(default)s)",
    )
    inst.add_argument(
        "--containerd-config",
        default=DEFAULT_CONFIG,
        help="--front nri: containerd's config file, whose imports take kubegpu's drop-in "
        "(default: %(default)s)",
    )
    inst.add_argument("--kubegpu-binary", default=DEFAULT_BINARY, help="(default: %(default)s)")
    inst.add_argument(
        "--cni-bin-dir",
        metavar="DIR",
        help="also install the RDMA CNI plugin: its launcher DIR/kubegpu-cni, in the runtime's CNI bin "
        "dir (e.g. /opt/cni/bin). The network config is not edited: the stanza to chain is printed",
    )
    inst.add_argument(
        "--cni-binary",
        metavar="PATH",
        help="--cni-bin-dir: the kubegpu-cni executable the launcher runs (default: beside --kubegpu-binary)",
    )
    inst.add_argument(
        "--cni-conf-dir",
        metavar="DIR",
        help=f"--cni-bin-dir: the runtime's network config dir, read by check (default: {DEFAULT_CONF_DIR})",
    )
    inst.add_argument(
        "--enable-now",
        action="store_true",
        help="run the systemctl steps (daemon-reload, enable --now, restart kubelet)",
    )
    inst.set_defaults(run=_run_install)

    uninst = actions.add_parser("uninstall", parents=[common], help="remove exactly what install wrote")
    uninst.add_argument("--disable-now", action="store_true", help="stop the shim and restart kubelet too")
    uninst.set_defaults(run=_run_uninstall)

    chk = actions.add_parser("check", parents=[common], help="does kubelet talk to a working shim?")
    chk.add_argument(
        "--kubelet-pid", type=cliargs.count(1), help="the kubelet to inspect (default: the one running)"
    )
    chk.set_defaults(run=_run_check)


def _plugin_names() -> list[str]:
    from devices.registry import plugin_names

    return plugin_names()


def _fail(message: str, code: int = 2) -> int:
    print(f"kubegpu node: {message}", file=sys.stderr)
    return code


def _run_install(args: argparse.Namespace) -> int:
    root = args.root.resolve()
    if args.enable_now and not systemd_running(root):
        return _fail("--enable-now needs systemd running this machine and --root / (nothing was written)")
    try:
        keys = {}
        if args.key_file == "-" and sys.stdin.isatty():
            raise InstallError(
                "--key-file - reads the key from standard input, which is a terminal: pipe it in"
            )
        if args.key_file is not None:
            keys[args.key_id] = validate_key(args.key_id, read_key(args.key_file, sys.stdin.buffer))
        if args.cni_bin_dir is None and (args.cni_binary or args.cni_conf_dir):
            raise InstallError("--cni-binary and --cni-conf-dir go with --cni-bin-dir")
        settings = NodeSettings(
            runtime_endpoint="unix://" + socket_path(args.containerd_socket),
            listen=args.listen,
            metrics_address=args.metrics_address,
            plugins=tuple(args.device_plugin),
            keys_dir=args.keys_dir,
            kubeconfig=args.kubeconfig,
            advertise=bool(args.device_plugin) and not args.no_advertise,
            node_name=args.node_name,
            sim_topology=args.sim_topology,
            sim_state_dir=args.sim_state_dir,
            binary=args.kubegpu_binary,
            front=args.front,
            nri_plugin_name=args.nri_plugin_name,
            nri_plugin_index=args.nri_plugin_index,
            containerd_config=args.containerd_config,
            cni_bin_dir=args.cni_bin_dir,
            cni_binary=args.cni_binary or os.path.join(os.path.dirname(args.kubegpu_binary), "kubegpu-cni"),
            cni_conf_dir=args.cni_conf_dir or DEFAULT_CONF_DIR,
        )
        result = install(root, settings, keys)
    except InstallError as exc:
        return _fail(str(exc))
    print(f"kubegpu node install: containerd {result.runtime}")
    for verb, paths in (
        ("wrote", result.written),
        ("unchanged", result.unchanged),
        ("removed", result.removed),
    ):
        for path in paths:
            print(f"  {verb:9} {path}")
    if settings.cni_bin_dir is not None:
        print(cni_chain_advice(root, settings))
    if result.front == "nri":
        why = (
            "to "
            + ("make containerd require the agent, then " if result.containerd_changed else "")
            + ("start the agent as containerd's NRI plugin")
        )
    else:
        why = "to start the shim and point kubelet at it"
    return _systemctl(args.enable_now, install_steps(result.front, result.containerd_changed), why)


def cni_chain_advice(root: Path, settings: NodeSettings) -> str:
    """What to do about the network config after install: nothing when it chains the plugin, else
    the stanza to add (install never edits it: the network add-on owns and rewrites it)."""
    where, problems = chain_status(root, settings.cni_conf_dir, settings.node_name, settings.keys_dir)
    if not problems:
        return f"kubegpu-cni is chained in {where}"
    stanza = json.dumps(chain_stanza(settings.node_name, settings.keys_dir))
    return (
        f"kubegpu-cni is not chained yet ({where}: {'; '.join(problems)}); install does not edit the "
        'network config (the network add-on owns it), so add this entry to its "plugins", after the '
        f"primary network's (docs/cni.md):\n  {stanza}"
    )


def _systemctl(now: bool, steps: Sequence[Sequence[str]], why: str) -> int:
    if now:
        try:
            run_systemctl(steps)
        except InstallError as exc:
            return _fail(str(exc), 1)
        print("  ran: " + "; ".join("systemctl " + shlex.join(step) for step in steps))
        return 0
    print(f"next, {why}:")
    for step in steps:
        print("  systemctl " + shlex.join(step))
    return 0


def _run_uninstall(args: argparse.Namespace) -> int:
    if _missing_root(args.root):
        return _fail(_missing_root(args.root))
    root = args.root.resolve()
    if args.disable_now and not systemd_running(root):
        return _fail("--disable-now needs systemd running this machine and --root /")
    try:
        stop = (lambda: run_systemctl(SYSTEMCTL_UNINSTALL_BEFORE)) if args.disable_now else None
        result = uninstall(root, before=stop)
    except InstallError as exc:
        return _fail(str(exc), 1)
    if result is None:
        print(f"kubegpu node uninstall: nothing to do (no /{RECORD})")
        return 0
    print("kubegpu node uninstall:")
    for verb, paths in (("removed", result.removed), ("missing", result.missing)):
        for path in paths:
            print(f"  {verb:9} {path}")
    for path in result.kept:
        print(f"  kept      {path} (changed since install; remove it yourself)")
    after = uninstall_steps_after(result.front, result.containerd_changed)
    if args.disable_now:
        return _systemctl(True, after, "")
    if result.front == "nri":
        why = "to stop the agent" + (
            " and let containerd create containers without it" if result.containerd_changed else ""
        )
    else:
        why = "to stop the shim and give kubelet containerd back"
    return _systemctl(False, (*SYSTEMCTL_UNINSTALL_BEFORE, *after), why)


def _missing_root(root: Path) -> str:
    """Why ``--root`` cannot be worked under ('' if it can)."""
    if root.is_dir():
        return ""
    return f"--root {root}: {'Not a directory' if root.exists() else 'No such directory'}"


def _run_check(args: argparse.Namespace) -> int:
    if _missing_root(args.root):
        return _fail(_missing_root(args.root))
    try:
        findings, record = check(args.root.resolve(), args.kubelet_pid)
    except InstallError as exc:
        return _fail(str(exc), 1)
    print(render_findings(findings, record.settings.front if record else "cri"))
    return 1 if any(f.ok is False for f in findings) else 0
