"""A node's private mount namespace: kubelet's fixed host paths and kernel tunables, kept off the host.

kubelet uses fixed paths (``/var/lib/kubelet``, its device-plugin directory under it,
``/var/log/pods``, ``/var/log/containers``), bind-mounts its root directory onto itself, and writes
kernel tunables (``vm.overcommit_memory``, ``kernel.panic``, ...). A node of the local cluster runs
kubelet, containerd and the CRI proxy inside one private mount namespace in which:

* ``/var/lib`` and ``/var/log`` are bind mounts of ``<node dir>/var-lib`` and ``<node dir>/var-log``
  (containerd sees the same pod log paths kubelet gives it);
* each tunable kubelet writes is shadowed by a bind-mounted file holding the host's value, so
  kubelet reads and writes that file and the host's setting never changes.

A holder process (``unshare`` then ``sleep``) keeps the namespace alive; the node's daemons join it
with ``nsenter``. When the holder and every daemon have exited, the kernel drops the namespace and
all mounts made in it (container root filesystems included): nothing is mounted on the host.

The host's values of the tunables are saved in ``<node dir>/sysctl/host-values.json`` when the
namespace is made; ``restore_tunables`` puts back any that differ (none should: kubelet never sees
the real files) and returns what it changed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubegpu.localcluster.processes import ProcessRecord, mount_namespace

# The tunables kubelet's container manager sets (pkg/kubelet/cm, setupKernelTunables).
KUBELET_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
PROC_SYS = Path("/proc/sys")
PRIVATE_DIRS = {"/var/lib": "var-lib", "/var/log": "var-log"}
READY_LINE = "kubegpu-namespace-ready"


class NamespaceError(RuntimeError):
    """The node namespace could not be made."""


def read_tunables(names: tuple[str, ...] = KUBELET_TUNABLES) -> dict[str, str]:
    """The host's current value of each tunable (as in /proc/sys, stripped), skipping absent ones."""
    values = {}
    for name in names:
        try:
            values[name] = (PROC_SYS / name).read_text().strip()
        except OSError:
            continue
    return values


def restore_tunables(saved: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Write back every saved value that differs now; return {name: (found, restored)}."""
    changed = {}
    for name, value in saved.items():
        current = read_tunables((name,)).get(name)
        if current is not None and current != value:
            (PROC_SYS / name).write_text(value + "\n")
            changed[name] = (current, value)
    return changed


def _holder_script(directory: Path, tunables: dict[str, str]) -> str:
    lines = ["set -e"]
    for target, sub in PRIVATE_DIRS.items():
        lines.append(f"mount --bind '{directory / sub}' '{target}'")
    for name in tunables:
        lines.append(f"mount --bind '{directory / 'sysctl' / name.replace('/', '.')}' '{PROC_SYS / name}'")
    lines.append(f"echo {READY_LINE}")
    lines.append("exec sleep infinity")
    return "\n".join(lines)


@dataclass
class MountNamespace:
    """The private mount namespace of one node, rooted at ``directory`` (the node's directory)."""

    directory: Path
    holder: ProcessRecord | None = None
    namespace_id: str | None = None
    saved_tunables: dict[str, str] = field(default_factory=dict)

    @property
    def tunables_file(self) -> Path:
        return self.directory / "sysctl" / "host-values.json"

    def start(self, timeout: float = 20.0) -> MountNamespace:
        """Make the namespace (private dirs, shadowed tunables) and wait until the holder is ready."""
        for tool in ("unshare", "nsenter", "mount", "sleep"):
            if shutil.which(tool) is None:
                raise NamespaceError(f"{tool!r} not found (util-linux and coreutils are needed)")
        for sub in PRIVATE_DIRS.values():
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        self.saved_tunables = read_tunables()
        shadow = self.directory / "sysctl"
        shadow.mkdir(parents=True, exist_ok=True)
        for name, value in self.saved_tunables.items():
            (shadow / name.replace("/", ".")).write_text(value + "\n")
        self.tunables_file.write_text(json.dumps(self.saved_tunables, indent=1, sort_keys=True))
        process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--",
             "sh", "-c", _holder_script(self.directory, self.saved_tunables)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
        )
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        output = []
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            if line.strip() == READY_LINE:
                process.stdout.close()
                self.holder = ProcessRecord.of("namespace", process.pid)
                self.namespace_id = mount_namespace(process.pid)
                if self.namespace_id is None or self.namespace_id == mount_namespace(1):
                    raise NamespaceError("the namespace holder is not in a new mount namespace")
                return self
            output.append(line)
        process.kill()
        process.wait()
        raise NamespaceError("could not make the node's mount namespace:\n" + "".join(output))

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside this namespace."""
        if self.holder is None:
            raise NamespaceError("the namespace is not started")
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--", *argv]

    def alive(self) -> bool:
        return self.holder is not None and self.holder.alive()

    def stop(self) -> dict[str, tuple[str, str]]:
        """Stop the holder and put back any tunable that differs from its saved value."""
        if self.holder is not None:
            self.holder.stop(timeout=5)
        return restore_tunables(self.saved_tunables)
