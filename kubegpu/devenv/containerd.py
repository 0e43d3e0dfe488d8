"""Run a private containerd (socket, root and state under one temp dir) for tests, demos, benches.

The instance is configured for these machines: the CRI sandbox image is a locally imported
busybox image, ``restrict_oom_score_adj`` is on (the VM refuses negative oom_score_adj), and
images under ``REGISTRY_HOST`` are pulled from a loopback registry served by this process.
``stop()`` removes every pod, kills leftover runtime shims, unmounts and deletes the directory.

Two containerd lines are supported. By default ``containerd``/``ctr`` come from PATH (Debian's
1.6, configured with a version-2 config). ``Containerd(bin_dir=containerd2_bin_dir())`` runs
the 2.x binaries that ``tests/containerd/build.sh`` builds into the testbin cache (for CRI
calls 1.6 lacks, such as GetContainerEvents): a version-3 config, registry hosts from a
``certs.d`` directory, and ``bin_dir`` first on containerd's PATH so that its own
``containerd-shim-runc-v2`` is used rather than the system's. The template follows the major
version that ``containerd --version`` reports.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubegpu.devenv.images import build_busybox_image, write_oci_tar
from kubegpu.devenv.registry import LocalRegistry

NAMESPACE = "k8s.io"
REGISTRY_HOST = "registry.kubegpu.test"
PAUSE_IMAGE = f"{REGISTRY_HOST}/pause:1.0"
BUSYBOX_IMAGE = f"{REGISTRY_HOST}/busybox:1.0"
# Pulled through CRI PullImage from the loopback registry, never imported.
PULL_IMAGE = f"{REGISTRY_HOST}/pullme:1.0"

CONFIG_TEMPLATE = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{cni_bin_dir}"
  conf_dir = "{base}/cni/conf"

[plugins."io.containerd.grpc.v1.cri".registry.mirrors."{registry_host}"]
  endpoint = ["http://{registry_addr}"]
"""


# containerd 2.x: CRI split into runtime/images plugins, sandbox image pinned, registry hosts
# from config_path (<base>/certs.d/<host>/hosts.toml, see HOSTS_TEMPLATE). The 2.x binaries
# are built without the btrfs/zfs/devmapper snapshotters; NRI is off (its default socket is global)
# unless the instance is given a socket of its own (``nri_socket``, NRI_TEMPLATE).
CONFIG_TEMPLATE_V3 = """version = 3
{imports}root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",{nri_disabled}
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause_image}"

[plugins."io.containerd.cri.v1.images".registry]
  config_path = "{base}/certs.d"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  # CDI (on by default in 2.x) reads specs from this instance's own directory, not the host's.
  enable_cdi = true
  cdi_spec_dirs = ["{base}/cdi"]

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni_bin_dir}"]
  conf_dir = "{base}/cni/conf"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

# NRI on a private socket: external plugins connect there; none are started from a plugin directory.
NRI_TEMPLATE = """
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{nri_socket}"
  plugin_path = "{base}/nri/plugins"
  plugin_config_path = "{base}/nri/conf.d"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
"""
# NRI's builtin validator: containerd refuses to create a container while a plugin named here is
# not connected (how an NRI front fails closed, docs/nri.md).
NRI_REQUIRED_TEMPLATE = """
[plugins."io.containerd.nri.v1.nri".default_validator]
  enable = true
  required_plugins = {required}
"""

# The only network config of a node: the loopback plugin (pods of the local cluster use the host
# network; this makes containerd's CNI, and so the Node, ready).
LOOPBACK_CONFLIST = """{
  "cniVersion": "1.0.0",
  "name": "kubegpu-loopback",
  "plugins": [{"type": "loopback"}]
}
"""

HOSTS_TEMPLATE = """server = "http://{registry_addr}"

[host."http://{registry_addr}"]
  capabilities = ["pull", "resolve"]
"""

CONTAINERD2_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD2_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")


class ContainerdError(RuntimeError):
    """containerd could not be started or driven."""


def containerd2_bin_dir() -> Path | None:
    """The testbin directory with the containerd 2.x binaries, or None when not (fully) built.

    Same path logic as tests/containerd/build.sh:
    ``<testbin root>/containerd-<version pinned in tests/containerd/go.mod>``.
    """
    from kubegpu.devenv.controlplane import REPO_ROOT, ControlPlaneError, pinned_version, testbin_root

    try:
        version = pinned_version(REPO_ROOT / "tests" / "containerd" / "go.mod", CONTAINERD2_MODULE)
    except (OSError, ControlPlaneError):
        return None
    directory = testbin_root() / f"containerd-{version}"
    if all(os.access(directory / name, os.X_OK) for name in CONTAINERD2_BINARIES):
        return directory
    return None


@functools.cache
def major_version(binary: str) -> int:
    """Major version of a containerd binary, from ``containerd --version``."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError as exc:
        raise ContainerdError(f"cannot run {binary} --version: {exc}") from exc
    # "containerd github.com/containerd/containerd 1.6.20~ds1 ..." or "... /v2 v2.2.9 ..."
    match = re.search(r"\sv?(\d+)\.\d+", out)
    if match is None:
        raise ContainerdError(f"cannot read a version from {binary} --version: {out!r}")
    return int(match.group(1))


@dataclass
class Containerd:
    """A private containerd instance. Use as a context manager or call start()/stop()."""

    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kgctd-", dir="/tmp")))
    binary: str = "containerd"
    ctr: str = "ctr"
    # Where containerd, ctr and containerd-shim-runc-v2 come from (None: PATH). When set, it
    # overrides ``binary``/``ctr`` and goes first on containerd's PATH (the shim it runs).
    bin_dir: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    registry: LocalRegistry | None = None
    # Put before containerd's command, e.g. ``nsenter --mount=...`` (a node's namespace).
    command_prefix: list[str] = field(default_factory=list)
    # CNI plugin directory (e.g. Debian's /usr/lib/cni). When set, a loopback-only network
    # config is written, so containerd reports the network ready (kubelet marks its Node Ready
    # only then); pods still use the host network.
    cni_bin_dir: Path | None = None
    # with cni_bin_dir: the network config (a conflist's JSON text) written instead of the
    # loopback-only one, so pods that are not on the host network get that network
    cni_conflist: str | None = None
    # containerd 2.x only: turn NRI on with its socket here (None: NRI off).
    nri_socket: Path | None = None
    # with nri_socket: plugins (by name, without their index) containerd requires for every create
    nri_required_plugins: tuple[str, ...] = ()
    # containerd 2.x only: the config's ``imports`` (drop-in files merged over it; a relative
    # pattern is taken from ``base``, where the config lives)
    config_imports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.bin_dir is not None:
            self.binary = str(self.bin_dir / "containerd")
            self.ctr = str(self.bin_dir / "ctr")

    @property
    def major_version(self) -> int:
        """1 or 2: which containerd line ``binary`` is (picks the config template)."""
        return major_version(self.binary)

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def endpoint(self) -> str:
        """CRI endpoint URL (unix://...) as kubelet would be given it."""
        return f"unix://{self.socket}"

    @property
    def log_path(self) -> Path:
        return self.base / "containerd.log"

    @property
    def cdi_spec_dir(self) -> Path:
        """Where a 2.x instance reads CDI specs (1.6 has no CDI)."""
        return self.base / "cdi"

    @property
    def config_path(self) -> Path:
        return self.base / "config.toml"

    def start(self, timeout: float = 30.0) -> Containerd:
        """Write config, start the loopback registry and containerd, import the base images."""
        self._check_tools()
        if self.registry is None:
            self.registry = LocalRegistry(
                [build_busybox_image(PULL_IMAGE, ["/bin/sh"])]
            ).start()
        for sub in ("root", "state", "opt", "cni/bin", "cni/conf", "images"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._write_config(self.registry.host)
        if self.cni_bin_dir is not None:
            name = "10-loopback.conflist" if self.cni_conflist is None else "10-pods.conflist"
            (self.base / "cni" / "conf" / name).write_text(self.cni_conflist or LOOPBACK_CONFLIST)
        self._launch(timeout)
        self.import_image(PAUSE_IMAGE, ["/bin/sleep", "2000000000"])
        self.import_image(BUSYBOX_IMAGE, ["/bin/sh"])
        return self

    def _check_tools(self) -> None:
        if self.bin_dir is None:
            tools, hint = [self.binary, self.ctr, "runc"], "apt-get install containerd runc"
        else:
            tools = [str(self.bin_dir / name) for name in CONTAINERD2_BINARIES] + ["runc"]
            hint = "bash tests/containerd/build.sh; apt-get install runc"
        for tool in tools:
            if shutil.which(tool) is None:
                raise ContainerdError(f"{tool!r} not found ({hint})")

    def _write_config(self, registry_addr: str) -> None:
        """containerd's config for its major version (and, for 2.x, the registry hosts dir)."""
        values = {
            "base": self.base, "root": self.base / "root", "state": self.base / "state",
            "cni_bin_dir": self.cni_bin_dir or self.base / "cni" / "bin",
            "socket": self.socket, "pause_image": PAUSE_IMAGE,
            "registry_host": REGISTRY_HOST, "registry_addr": registry_addr,
        }
        if self.major_version < 2:
            self.config_path.write_text(CONFIG_TEMPLATE.format(**values))
            return
        hosts = self.base / "certs.d" / REGISTRY_HOST / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(HOSTS_TEMPLATE.format(**values))
        self.cdi_spec_dir.mkdir(exist_ok=True)
        values["nri_disabled"] = "" if self.nri_socket else ' "io.containerd.nri.v1.nri",'
        imports = json.dumps(list(self.config_imports))
        values["imports"] = f"imports = {imports}\n" if self.config_imports else ""
        config = CONFIG_TEMPLATE_V3.format(**values)
        if self.nri_socket is not None:
            for sub in ("nri/plugins", "nri/conf.d"):
                (self.base / sub).mkdir(parents=True, exist_ok=True)
            config += NRI_TEMPLATE.format(nri_socket=self.nri_socket, base=self.base)
            if self.nri_required_plugins:
                required = json.dumps(list(self.nri_required_plugins))
                config += NRI_REQUIRED_TEMPLATE.format(required=required)
        self.config_path.write_text(config)

    def _environment(self) -> dict[str, str]:
        """containerd's environment: bin_dir (its shim) ahead of the system's binaries."""
        env = dict(os.environ)
        if self.bin_dir is not None:
            env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", os.defpath)])
        return env

    def _launch(self, timeout: float) -> None:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [*self.command_prefix, self.binary, "--config", str(self.config_path), "--log-level", "info"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._environment(),
            start_new_session=True,
        )
        log.close()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """Block until containerd answers on its socket, or raise with the log tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ContainerdError(f"containerd exited early:\n{self.log_tail()}")
            if self.socket.exists():
                probe = subprocess.run(
                    [self.ctr, "--address", str(self.socket), "version"],
                    capture_output=True,
                    timeout=10,
                )
                if probe.returncode == 0:
                    return
            time.sleep(0.1)
        raise ContainerdError(f"containerd not ready after {timeout}s:\n{self.log_tail()}")

    def import_image(self, ref: str, entrypoint: list[str]) -> None:
        """Build a busybox image and import it into the k8s.io namespace under ``ref``."""
        tar = write_oci_tar(
            build_busybox_image(ref, entrypoint),
            self.base / "images" / (ref.replace("/", "_").replace(":", "_") + ".tar"),
        )
        self.run_ctr("images", "import", "--no-unpack", str(tar))

    def run_ctr(self, *args: str) -> str:
        """Run ``ctr`` against this instance in the k8s.io namespace and return its stdout."""
        result = subprocess.run(
            [self.ctr, "--address", str(self.socket), "--namespace", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def kill(self) -> None:
        """SIGKILL containerd itself (runtime shims and containers stay up)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop containerd (SIGTERM) and start it again with the same config and state."""
        self.terminate()
        self._launch(timeout)

    def terminate(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no containerd log)"

    def kill_all_tasks(self) -> None:
        """SIGKILL every container task, when containerd answers on the socket (whoever started it)."""
        if self.process is not None and self.process.poll() is not None:
            return
        if not self.socket.exists():
            return
        try:
            pods = self.run_ctr("containers", "ls", "--quiet").split()
            for container_id in pods:
                subprocess.run(
                    [self.ctr, "--address", str(self.socket), "-n", NAMESPACE,
                     "tasks", "kill", "--signal", "SIGKILL", container_id],
                    capture_output=True, timeout=20,
                )
        except (ContainerdError, subprocess.TimeoutExpired):
            pass

    def _kill_leftover_shims(self) -> None:
        needle = str(self.socket).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and needle in cmdline:
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _unmount_all(self) -> None:
        prefix = str(self.base)
        mounts = [
            line.split()[1]
            for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(prefix)
        ]
        for mountpoint in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mountpoint], capture_output=True)

    def stop(self, remove_base: bool = True) -> None:
        """Tear everything down: tasks, containerd, shims, mounts, registry, directory.

        ``remove_base=False`` keeps the directory (its owner removes it later, e.g. after the
        mount namespace holding its mounts is gone).
        """
        self.kill_all_tasks()
        self.terminate()
        time.sleep(0.2)
        self._kill_leftover_shims()
        self._unmount_all()
        if self.registry is not None:
            self.registry.stop()
            self.registry = None
        if remove_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Containerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
