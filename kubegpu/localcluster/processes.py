"""Records of the daemons a local cluster starts, stopping them by record, and the leftover sweep.

A record is (name, pid, start time): the start time (field 22 of /proc/<pid>/stat) tells a
recorded process from a later one that reuses its pid, so ``kubegpu down`` in a new Python process
stops exactly what ``kubegpu up`` started. Every daemon is started in its own session, so its pid
is also its process group and a stop reaches its children.

``processes_of`` and ``mounts_under`` find what a teardown may have left:
processes whose command line names the state directory, processes in one of the node namespaces,
their descendants, mounts under the state directory, and the cgroup parent containerd makes on
first use (``k8s.io`` in each hierarchy) when the cluster made it. ``sweep`` SIGKILLs those
processes; ``remove_cgroups`` removes those cgroup parents once they are empty;
``remove_runtime_remains`` removes what the runc shims of a killed containerd kept on the host.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3 first), or None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_running(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status when it is our child (no zombie stays behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


@dataclass(frozen=True)
class ProcessRecord:
    """One started daemon: its name, pid (= process group) and start time."""

    name: str
    pid: int
    start_time: int

    @classmethod
    def of(cls, name: str, pid: int) -> ProcessRecord:
        started = start_time(pid)
        if started is None:
            raise ProcessLookupError(f"{name} (pid {pid}) is not running")
        return cls(name, pid, started)

    def alive(self) -> bool:
        """True while the recorded process (not a later one with its pid) runs."""
        return start_time(self.pid) == self.start_time and is_running(self.pid)

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the process group, only while the recorded leader still exists."""
        if start_time(self.pid) != self.start_time:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the group, wait up to ``timeout``, then SIGKILL the group; reap our children."""
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(self.pid)
            if not self.alive():
                break
            time.sleep(0.05)
        self.signal_group(signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(self.pid)
            if not is_running(self.pid) or start_time(self.pid) != self.start_time:
                return
            time.sleep(0.05)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "startTime": self.start_time}

    @classmethod
    def from_dict(cls, doc: dict[str, object]) -> ProcessRecord:
        return cls(str(doc["name"]), int(str(doc["pid"])), int(str(doc["startTime"])))


# --------------------------------------------------------------------------- leftovers


def mount_namespace(pid: int) -> str | None:
    """The mount namespace of ``pid`` (e.g. ``mnt:[4026532451]``), or None when unreadable."""
    try:
        return os.readlink(PROC / str(pid) / "ns" / "mnt")
    except OSError:
        return None


def _pids() -> Iterator[int]:
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def _parents() -> dict[int, int]:
    parents = {}
    for pid in _pids():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] not in ("Z", "X"):
            parents[pid] = int(fields[1])
    return parents


def processes_of(state_dir: Path, mount_namespaces: Iterable[str] = ()) -> set[int]:
    """Live processes that belong to a local cluster, with all their descendants.

    A process belongs when its command line names a path inside ``state_dir``, or it runs in one
    of the ``mount_namespaces`` (the node namespaces) and so does a process of the first kind:
    a namespace id alone is not proof, since the kernel reuses the ids of namespaces that are
    gone. Container processes are found as descendants of the containerd shims.
    """
    needle = os.fsencode(str(state_dir).rstrip("/") + "/")
    namespaces = set(mount_namespaces)
    parents = _parents()
    roots = set()
    namespace_of: dict[int, str | None] = {}
    for pid in parents:
        if pid == os.getpid():
            continue
        try:
            cmdline = (PROC / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if namespaces:
            namespace_of[pid] = mount_namespace(pid)
        if needle in cmdline:
            roots.add(pid)
    ours = {namespace_of.get(pid) for pid in roots} & namespaces
    roots |= {pid for pid, namespace in namespace_of.items() if namespace in ours}
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in found and pid not in found and pid != os.getpid():
                found.add(pid)
                changed = True
    return found


def mounts_under(path: Path) -> list[str]:
    """Mount points (in this process's mount namespace) at or under ``path``."""
    prefix = str(path).rstrip("/")
    points = []
    for line in (PROC / "self" / "mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return points


def sweep(state_dir: Path, mount_namespaces: Iterable[str] = (), timeout: float = 10.0) -> list[int]:
    """SIGKILL every process of the local cluster that is still there; return their pids."""
    namespaces = list(mount_namespaces)
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = processes_of(state_dir, namespaces)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
            _reap(pid)
        time.sleep(0.1)
    return sorted(set(killed))


# --------------------------------------------------------------------------- cgroups

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTAINERD_CGROUP = "k8s.io"  # containerd's CRI puts containers without a parent at /k8s.io/<id>


def containerd_cgroup_parents() -> list[Path]:
    """Where containerd's ``k8s.io`` cgroup parent goes: each v1 hierarchy, or the v2 root."""
    candidates = [CGROUP_ROOT / CONTAINERD_CGROUP]
    try:
        candidates += [entry / CONTAINERD_CGROUP for entry in sorted(CGROUP_ROOT.iterdir())
                       if entry.is_dir() and not entry.is_symlink() and (entry / "cgroup.procs").exists()]
    except OSError:
        pass
    return candidates


def absent_cgroup_parents() -> list[str]:
    """The containerd cgroup parents that do not exist yet (so the cluster will have made them)."""
    return [str(path) for path in containerd_cgroup_parents()
            if path.parent.exists() and not path.exists()]


def remove_cgroups(paths: Iterable[str]) -> list[str]:
    """rmdir each cgroup parent the cluster made; return those still there.

    Only an empty cgroup can be removed: a parent that still holds containers of another
    containerd on the host stays (it is theirs too now), and so does one still holding ours,
    which the process checks report.
    """
    left = []
    for path in paths:
        try:
            Path(path).rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            left.append(path)
    return left


# --------------------------------------------------------------------------- containerd's host files

RUN_CONTAINERD = Path("/run/containerd")  # where containerd's runc shims keep state, whatever its config
TASKS = "io.containerd.runtime.v2.task"  # containerd's task bundles, one folder per container


def runtime_remains(containerd_state: Path) -> list[Path]:
    """What containerd's runc shims keep on the host for the containers of one containerd.

    The shims keep runc's state under ``/run/containerd/runc/<namespace>/<id>``, a socket under
    ``/run/containerd/s`` (named in the bundle's ``address`` file), and the container's cgroup
    ``k8s.io/<id>`` in every hierarchy. containerd removes them when it removes a container; a
    containerd killed with its containers leaves them. The container ids come from the bundles
    under ``containerd_state`` (its ``state`` directory), so only this containerd's are named.
    """
    found = []
    for bundle in sorted((containerd_state / TASKS).glob("*/*")):
        namespace, cid = bundle.parent.name, bundle.name
        try:
            address = (bundle / "address").read_text().strip()
        except OSError:
            address = ""
        socket = Path(address.removeprefix("unix://"))
        if address.startswith("unix://") and socket.parent == RUN_CONTAINERD / "s":
            found.append(socket)
        found.append(RUN_CONTAINERD / "runc" / namespace / cid)
        found += [parent / cid for parent in containerd_cgroup_parents()]
    return [path for path in found if os.path.lexists(path)]


def remove_runtime_remains(containerd_state: Path) -> list[str]:
    """Remove ``runtime_remains`` (run after every process of the node is gone); return what stays.

    A cgroup is only removed when empty (rmdir); one that still holds a process stays, and the
    process checks report that process.
    """
    left = []
    for path in runtime_remains(containerd_state):
        try:
            if path.is_relative_to(CGROUP_ROOT):
                _rmdir_cgroup(path)
            elif path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError:
            left.append(str(path))
    return left


def _rmdir_cgroup(path: Path, timeout: float = 5.0) -> None:
    """rmdir a cgroup; a killed container's cgroup stays busy (EBUSY) for a moment after its
    processes died, until the kernel has released them: retry that for up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
