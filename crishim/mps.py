"""Enforced GPU shares with NVIDIA MPS: one control daemon per shared GPU, and each share's client edits.

On a node that enforces shares, a container holding a fractional share of a GPU runs as an MPS
client of that GPU's own control daemon (docs/gpu-sharing.md is the contract):

- the daemon runs with ``CUDA_VISIBLE_DEVICES=<GPU id>`` (its clients see that GPU as device 0) and
  its pipe, log and shared-memory directories under ``<mps dir>/<GPU id>/``, in a private mount
  namespace whose ``/dev/shm`` is that shm directory (the MPS server and its clients must share
  ``/dev/shm``, and a container has its own);
- the container gets the pipe and log directories, read-only, at the same paths as on the host
  (daemon, server and clients then name every pipe and socket alike), the shm directory at
  ``/dev/shm``, and ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``,
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (milli / 10, rounded up) and, when the share's memory is
  known, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<memory MiB>M``.

``MpsSupervisor`` starts a GPU's daemon on first use (``ensure``), knows whether it still lives
(its pid and start time, recorded at the start in ``<mps dir>/<GPU id>/kubegpu-daemon``, where no
container reaches), stops it (``quit`` on the control's stdin, then signals) and adopts daemons a
previous agent left running. A restart keeps the pipe and shm directories (emptied, same inodes),
so running client containers, which have them mounted, reach the new daemon.
``MpsSharing`` is the node's policy on top: which GPUs enforce shares (the advertiser publishes
each GPU's ``sharing`` attribute), the client edits for one container, and a watchdog thread that
keeps the running daemons equal to the GPUs the ledger holds shares of (restarting dead ones,
stopping those whose last share left). This module imports no gRPC: the GPU proof
(``kubegpu.gpu_proof``) uses it on machines without the CRI stubs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devices.model import Device, DeviceKind, NodeInventory, Sharing, with_sharing
from devices.plugin import ContainerEdits, GpuShare, Mount, PluginError
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.mps")

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the control daemon in its pipe directory
# The supervisor's own record of a GPU's daemon (pid and start time), beside (not in) the directories
# client containers mount: they can write the pipe directory's pid file, never this one.
RECORD_FILE = "kubegpu-daemon"
DEFAULT_MPS_DIR = "/run/kubegpu/mps"
START_LOG = "kubegpu-start.log"  # the control's own output when started, in the log directory
CLIENT_SHM_DIR = "/dev/shm"  # where a client container gets its daemon's shared memory
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
WHOLE = 1000  # a share of 1000 milli is the whole GPU: no MPS client
_GPU_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:\-]{0,127}$")
# Run a command in a private mount namespace whose /dev/shm is "$1" (the daemon's shm directory).
_SHM_WRAPPER = 'mount --bind "$1" /dev/shm && shift && exec "$@"'

ComputeModeHook = Callable[[str, bool], None]  # (GPU id, exclusive) -> None; raises on failure


class DaemonError(Exception):
    """A GPU's MPS daemon could not be started or reached; the message names the GPU and why."""


class ShareRefused(PluginError):
    """A container's share cannot be enforced as allocated (an MPS client uses exactly one GPU)."""


# --- pure: directories, limits, client edits ---------------------------------------------------


@dataclass(frozen=True)
class DaemonDirs:
    """The directories of one GPU's daemon on the host."""

    root: Path

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def shm(self) -> Path:
        return self.root / "shm"

    @property
    def pid_file(self) -> Path:
        return self.pipe / PID_FILE

    @property
    def record(self) -> Path:
        return self.root / RECORD_FILE

    def daemon_env(self, gpu: str) -> dict[str, str]:
        """What the control daemon (and the control client talking to it) is started with."""
        return {"CUDA_VISIBLE_DEVICES": gpu, PIPE_ENV: str(self.pipe), LOG_ENV: str(self.log)}


def active_thread_percentage(milli: int) -> int:
    """A share's compute as MPS's active thread percentage: milli / 10 rounded up, in 1..100."""
    return max(1, min(100, -(-int(milli) // 10)))


def pinned_memory_limit(memory_mib: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for a client of a one-GPU daemon (its device 0)."""
    return f"0={int(memory_mib)}M"


def share_memory_mib(share: GpuShare, device: Device) -> int:
    """The share's GPU memory; a share given by milli only gets that fraction of the GPU's memory
    (the scheduler's rule), 0 when the GPU's memory is unknown too."""
    if share.memory_mib:
        return int(share.memory_mib)
    return device.memory_mib * int(share.milli) // WHOLE


def client_edits(dirs: DaemonDirs, milli: int, memory_mib: int) -> ContainerEdits:
    """What makes a container an MPS client of ``dirs``' daemon with a share's limits."""
    env = {
        PIPE_ENV: str(dirs.pipe),
        LOG_ENV: str(dirs.log),
        THREADS_ENV: str(active_thread_percentage(milli)),
    }
    if memory_mib > 0:
        env[MEMORY_ENV] = pinned_memory_limit(memory_mib)
    return ContainerEdits(
        env=env,
        mounts=(
            # Read-only: clients only connect to the daemon's sockets and FIFOs there (a real MPS
            # client works so, docs/gpu-sharing.md); they cannot remove them or plant files.
            Mount(str(dirs.pipe), str(dirs.pipe), readonly=True),
            Mount(str(dirs.log), str(dirs.log), readonly=True),
            Mount(str(dirs.shm), CLIENT_SHM_DIR, readonly=False),
        ),
    )


# --- processes ---------------------------------------------------------------------------------


def _process_alive(pid: int, name: str) -> bool:
    """A live (not zombie) process whose command line runs a program called ``name``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[:1]
    if state in (["Z"], ["X"]):
        return False
    return any(os.path.basename(arg.decode(errors="replace")) == name for arg in argv if arg)


def _start_time(pid: int) -> int | None:
    """When the process started (clock ticks after boot, /proc/<pid>/stat field 22): with the pid,
    it names one process for good, where a pid alone may be reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _serves(pid: int, pipe: Path) -> bool:
    """The process was started with ``CUDA_MPS_PIPE_DIRECTORY=<pipe>`` (an MPS process of that GPU)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{PIPE_ENV}={pipe}".encode() in environ


def _empty(directory: Path) -> None:
    """Remove what ``directory`` holds, keeping the directory itself (its inode: client containers
    have it bind-mounted). Links are removed, never followed."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def mps_processes(pipe: Path) -> list[int]:
    """Processes of NVIDIA MPS (control daemon, server) serving ``pipe``: found by their environment."""
    wanted = f"{PIPE_ENV}={pipe}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(os.path.basename(a.decode(errors="replace")).startswith("nvidia-cuda-mps") for a in argv if a):
            if wanted in environ:
                found.append(int(entry.name))
    return found


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class MpsSupervisor:
    """The MPS control daemons of one node, one per GPU, under ``root/<GPU id>/``.

    ``control`` is the ``nvidia-cuda-mps-control`` executable. With ``private_shm`` (the node
    agent, as root) each daemon runs in its own mount namespace with the GPU's shm directory as
    ``/dev/shm``; without it the daemon uses the host's ``/dev/shm`` (host processes as clients).
    ``compute_mode(gpu, exclusive)`` is called before a start (True) and after a stop (False).
    Every method is thread-safe; the calls for one GPU are serialised.
    """

    def __init__(
        self,
        control: str,
        root: Path | str,
        *,
        private_shm: bool = True,
        compute_mode: ComputeModeHook | None = None,
        start_timeout: float = 15.0,
        stop_timeout: float = 15.0,
        unshare: str = "unshare",
        retry_after: float = 300.0,
    ) -> None:
        self.control = control
        self.name = os.path.basename(control)
        self.root = Path(root)
        self.private_shm = private_shm
        self.compute_mode = compute_mode
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.unshare = unshare
        self.retry_after = retry_after
        self.starts: Counter[str] = Counter()  # successful starts per GPU (restarts included)
        self.failures: dict[str, tuple[float, str]] = {}  # GPU -> (monotonic time, why) of its last failure
        self._lock = threading.Lock()
        self._gpu_locks: dict[str, threading.Lock] = {}
        self._pids: dict[str, int] = {}

    # -- lookups --------------------------------------------------------------------------------

    def dirs(self, gpu: str) -> DaemonDirs:
        if not _GPU_ID.match(gpu):
            raise DaemonError(f"GPU id {gpu[:80]!r} cannot name an MPS directory")
        return DaemonDirs(self.root / gpu)

    def _gpu_lock(self, gpu: str) -> threading.Lock:
        with self._lock:
            return self._gpu_locks.setdefault(gpu, threading.Lock())

    def pid(self, gpu: str) -> int | None:
        """The PID of the GPU's live control daemon, or None.

        The daemon is the process the supervisor recorded when it started it (pid and start time,
        in a file no container can reach), still alive under that start time and name. The pid
        file the daemon writes in its pipe directory is never trusted after the start: client
        containers mount that directory, and a pid may since belong to another process (another
        GPU's daemon, say).
        """
        dirs = self.dirs(gpu)
        try:
            pid_text, start_text = dirs.record.read_text().split()
            pid, start = int(pid_text), int(start_text)
        except (OSError, ValueError):
            return None
        if _start_time(pid) != start or not _process_alive(pid, self.name):
            return None
        return pid

    def is_running(self, gpu: str) -> bool:
        return self.pid(gpu) is not None

    def known(self) -> set[str]:
        """GPUs with a daemon or daemon directory here (this agent's, or left by an earlier one)."""
        found = set(self._pids)
        try:
            found |= {p.name for p in self.root.iterdir() if p.is_dir() and _GPU_ID.match(p.name)}
        except OSError:
            pass
        return found

    def failed_within(self, gpu: str, seconds: float) -> bool:
        """The GPU's daemon failed to start less than ``seconds`` ago."""
        failure = self.failures.get(gpu)
        return failure is not None and time.monotonic() - failure[0] < seconds

    def failing(self, gpu: str) -> str:
        """Why the GPU's daemon last failed to start, if that was less than ``retry_after`` ago."""
        failure = self.failures.get(gpu)
        if failure is None or time.monotonic() - failure[0] > self.retry_after:
            return ""
        return failure[1]

    # -- commands -------------------------------------------------------------------------------

    def _wrap(self, dirs: DaemonDirs, argv: Sequence[str]) -> list[str]:
        if not self.private_shm:
            return list(argv)
        return [
            self.unshare, "--mount", "--propagation", "private", "--",
            "sh", "-c", _SHM_WRAPPER, "kubegpu-mps", str(dirs.shm), *argv,
        ]  # fmt: skip

    def _env(self, gpu: str, dirs: DaemonDirs) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CUDA_MPS_") and k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
        }
        return {**base, **dirs.daemon_env(gpu)}

    def command(self, gpu: str, text: str, timeout: float | None = None) -> str:
        """Send one command (``get_server_list``, ``quit`` ...) to the GPU's daemon; its answer."""
        dirs = self.dirs(gpu)
        try:
            done = subprocess.run(
                self._wrap(dirs, [self.control]),
                input=text.rstrip("\n") + "\n",
                capture_output=True,
                text=True,
                env=self._env(gpu, dirs),
                timeout=timeout or self.stop_timeout,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DaemonError(f"GPU {gpu}: MPS control command {text!r} failed: {exc}") from exc
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip()[-300:] or f"exit status {done.returncode}"
            raise DaemonError(f"GPU {gpu}: MPS control command {text!r} failed: {why}")
        return done.stdout

    # -- start ----------------------------------------------------------------------------------

    def ensure(self, gpu: str) -> DaemonDirs:
        """The GPU's daemon is running (started now, or already; adopted if an earlier agent left
        it). Raises ``DaemonError`` when it cannot be started."""
        dirs = self.dirs(gpu)
        with self._gpu_lock(gpu):
            return self._ensure_locked(gpu, dirs)

    def ensure_if(self, gpu: str, wanted: Callable[[], bool]) -> bool:
        """``ensure`` only if ``wanted()`` still says so, asked under the GPU's lock: a GPU whose
        last share left (and that a container may now hold whole, after ``stop``) gets no daemon
        started or adopted. True if the daemon runs. Raises ``DaemonError`` like ``ensure``."""
        dirs = self.dirs(gpu)
        with self._gpu_lock(gpu):
            if not wanted():
                log_event(log, "mps.start_skipped", gpu=gpu, reason="no share of the GPU is held any more")
                return False
            self._ensure_locked(gpu, dirs)
            return True

    def _ensure_locked(self, gpu: str, dirs: DaemonDirs) -> DaemonDirs:
        pid = self.pid(gpu)
        if pid is not None:
            if gpu not in self._pids:
                self._pids[gpu] = pid
                log_event(log, "mps.daemon_adopted", gpu=gpu, pid=pid)
            return dirs
        try:
            pid = self._start(gpu, dirs)
        except DaemonError as error:
            self.failures[gpu] = (time.monotonic(), str(error))
            log_event(log, "mps.daemon_start_failed", logging.ERROR, gpu=gpu, error=str(error))
            raise
        self.failures.pop(gpu, None)
        restarted = gpu in self._pids
        self._pids[gpu] = pid
        self.starts[gpu] += 1
        log_event(log, "mps.daemon_restarted" if restarted else "mps.daemon_started", gpu=gpu, pid=pid)
        return dirs

    def _start(self, gpu: str, dirs: DaemonDirs) -> int:
        # No live daemon (pid() said so): whatever a dead one left (an orphaned server, its pipes,
        # pid file and shared memory) goes before a new one starts. The pipe and shm directories
        # themselves stay: running clients' containers have them mounted, and a new daemon in
        # the same directories (same inodes) is one their next CUDA processes reach.
        self._kill_leftovers(dirs)
        dirs.record.unlink(missing_ok=True)
        for stale in (dirs.pipe, dirs.shm):
            if stale.is_symlink() or (stale.exists() and not stale.is_dir()):
                stale.unlink()
            _empty(stale)
        for path, mode in ((dirs.pipe, 0o755), (dirs.log, 0o755), (dirs.shm, 0o1777)):
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, mode)
        if self.compute_mode is not None:
            try:
                self.compute_mode(gpu, True)
            except Exception as exc:  # noqa: BLE001 - any refusal means: no enforcement here
                raise DaemonError(f"GPU {gpu}: cannot set EXCLUSIVE_PROCESS compute mode: {exc}") from exc
        output = dirs.log / START_LOG
        try:
            with output.open("ab") as out:
                done = subprocess.run(
                    self._wrap(dirs, [self.control, "-d"]),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self._env(gpu, dirs),
                    timeout=self.start_timeout,
                    start_new_session=True,
                )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._undo_compute_mode(gpu)
            raise DaemonError(f"GPU {gpu}: cannot start {self.control} -d: {exc}") from exc
        if done.returncode != 0:
            self._undo_compute_mode(gpu)
            raise DaemonError(f"GPU {gpu}: {self.control} -d exited with {done.returncode}: {_tail(output)}")
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            pid = _read_pid(dirs.pid_file)
            # The daemon -d just started: alive, named so, and serving this GPU's pipe directory.
            if pid is not None and _process_alive(pid, self.name) and _serves(pid, dirs.pipe):
                start = _start_time(pid)
                if start is not None:
                    record = dirs.record.with_name(RECORD_FILE + ".tmp")
                    record.write_text(f"{pid} {start}\n")
                    record.replace(dirs.record)
                    return pid
            time.sleep(0.05)
        self._kill_leftovers(dirs)
        self._undo_compute_mode(gpu)
        raise DaemonError(
            f"GPU {gpu}: {self.control} -d left no live daemon ({PID_FILE}) within "
            f"{self.start_timeout:g}s: {_tail(output)}"
        )

    def _undo_compute_mode(self, gpu: str) -> None:
        if self.compute_mode is None:
            return
        try:
            self.compute_mode(gpu, False)
        except Exception as exc:  # noqa: BLE001 - logged; the GPU stays in the mode it is in
            log_event(log, "mps.compute_mode_reset_failed", logging.WARNING, gpu=gpu, error=str(exc))

    # -- stop -----------------------------------------------------------------------------------

    def stop(self, gpu: str, keep: Callable[[], bool] | None = None) -> bool:
        """Stop the GPU's daemon and remove its directories, unless ``keep()`` says (under the GPU's
        lock, so no start for it runs meanwhile) that it is wanted again. True if stopped."""
        dirs = self.dirs(gpu)
        with self._gpu_lock(gpu):
            if keep is not None and keep():
                return False
            pid = self.pid(gpu)
            how = "absent"
            if pid is not None:
                how = "quit"
                try:
                    self.command(gpu, "quit")
                except DaemonError as error:
                    log_event(log, "mps.quit_failed", logging.WARNING, gpu=gpu, pid=pid, error=str(error))
                if not _wait_gone(pid, self.name, self.stop_timeout):
                    how = "killed"
            if self._kill_leftovers(dirs):
                how = "killed"
            self._pids.pop(gpu, None)
            self._undo_compute_mode(gpu)
            shutil.rmtree(dirs.root, ignore_errors=True)
            log_event(log, "mps.daemon_stopped", gpu=gpu, pid=pid, how=how)
            return True

    def _kill_leftovers(self, dirs: DaemonDirs) -> bool:
        """SIGTERM, then SIGKILL, whatever MPS processes still serve this pipe directory (found by
        their environment; the pid file, which client containers can write, names nobody)."""
        pids = mps_processes(dirs.pipe)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in pids:
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and any(_exists(p) for p in pids):
                time.sleep(0.05)
        return bool(pids)

    def stop_all(self) -> None:
        for gpu in sorted(self.known()):
            self.stop(gpu)


def _exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] not in (["Z"], ["X"])


def _wait_gone(pid: int, name: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _process_alive(pid, name):
            return True
        time.sleep(0.05)
    return False


def _tail(path: Path, limit: int = 300) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "(no output)"
    return text[-limit:] or "(no output)"


# --- the node's policy ---------------------------------------------------------------------------


class MpsSharing:
    """How this node enforces GPU shares: with ``supervisor``, through MPS; without, advisory only
    (``reason`` says why). ``start(wanted)`` runs the watchdog: every ``interval`` seconds, or when
    poked, the GPUs in ``wanted()`` (those with shares) get a running daemon and the others none;
    after a failed start of a GPU's daemon it waits ``retry_seconds`` before trying that GPU again."""

    def __init__(
        self,
        supervisor: MpsSupervisor | None,
        reason: str = "",
        interval: float = 5.0,
        retry_seconds: float = 30.0,
    ) -> None:
        self.supervisor = supervisor
        self.reason = reason
        self.interval = interval
        self.retry_seconds = retry_seconds  # the watchdog's pause after a failed start of a GPU's daemon
        self._wanted: Callable[[], Collection[str]] = frozenset
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enforced(self) -> bool:
        return self.supervisor is not None

    def mode(self, device: Device) -> Sharing:
        """MPS when shares of the GPU are enforced now; advisory without MPS or while its daemon fails."""
        if self.supervisor is None or self.supervisor.failing(device.id):
            return Sharing.ADVISORY
        return Sharing.MPS

    def annotate(self, inventory: NodeInventory) -> NodeInventory:
        """The inventory with each GPU's ``sharing`` attribute (what the advertiser publishes)."""
        return with_sharing(inventory, self.mode)

    def share_to_enforce(
        self, devices: Sequence[Device], shares: Mapping[str, GpuShare]
    ) -> tuple[Device, GpuShare] | None:
        """The (GPU, share) that makes this container an MPS client, or None (whole GPUs, advisory).
        Raises ``ShareRefused`` for a share beside other GPUs: an MPS client sees one GPU."""
        if self.supervisor is None:
            return None
        shared = [d for d in devices if d.id in shares and int(shares[d.id].milli) < WHOLE]
        if not shared:
            return None
        gpus = [d.id for d in devices if d.kind is DeviceKind.GPU]
        if len(gpus) != 1:
            raise ShareRefused(
                f"a share of GPU {shared[0].id} is enforced through MPS, whose client sees exactly one GPU, "
                f"but the container is allocated {len(gpus)} GPUs ({', '.join(gpus)})"
            )
        return shared[0], shares[shared[0].id]

    async def container_edits(
        self, devices: Sequence[Device], shares: Mapping[str, GpuShare], wait: float | None = None
    ) -> ContainerEdits:
        """The MPS client edits for a container's devices (starting the GPU's daemon if needed).
        A GPU the container gets whole first loses any daemon still running for it (the watchdog
        stops it only on its next pass; until then the GPU is in EXCLUSIVE_PROCESS mode beside an
        MPS server, busy for anyone else). Raises ``ShareRefused`` (cannot be enforced as
        allocated) or ``DaemonError`` (try again): also when the daemon has not started within
        ``wait`` seconds (None: as long as the start takes), the time the front's caller gives a
        create (containerd's NRI request timeout); the start goes on, and names its failure to
        the next create."""
        found = self.share_to_enforce(devices, shares)
        supervisor = self.supervisor
        if supervisor is None:
            return ContainerEdits()
        loop = asyncio.get_running_loop()
        whole = [
            d.id
            for d in devices
            if d.kind is DeviceKind.GPU and (d.id not in shares or int(shares[d.id].milli) >= WHOLE)
        ]
        for gpu in set(whole) & supervisor.known():
            await loop.run_in_executor(None, self._stop_unless_shared, gpu)
        if found is None:
            return ContainerEdits()
        device, share = found
        start = loop.run_in_executor(None, supervisor.ensure, device.id)
        start.add_done_callback(lambda done: done.cancelled() or done.exception())  # read: never unseen
        try:
            dirs = await asyncio.wait_for(asyncio.shield(start), wait)
        except TimeoutError:
            last = supervisor.failing(device.id)
            why = f"its last start failed: {last}" if last else "it may still be starting"
            raise DaemonError(
                f"GPU {device.id}: its MPS daemon has not started within {wait:g}s, the time this create "
                f"may wait ({why})"
            ) from None
        return client_edits(dirs, int(share.milli), share_memory_mib(share, device))

    def _stop_unless_shared(self, gpu: str) -> None:
        assert self.supervisor is not None
        self.supervisor.stop(gpu, keep=lambda: self._still_wanted(gpu))

    # -- watchdog -------------------------------------------------------------------------------

    def start(self, wanted: Callable[[], Collection[str]]) -> None:
        """Start the watchdog (once the node knows which shares it holds: after the ledger rebuild)."""
        if self.supervisor is None or self._thread is not None:
            return
        self._wanted = wanted
        self._thread = threading.Thread(target=self._run, name="mps-watchdog", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """The shares changed: reconcile soon (never blocks)."""
        self._wake.set()

    def _still_wanted(self, gpu: str) -> bool:
        return gpu in set(self._wanted())

    def reconcile(self) -> None:
        """One pass: a daemon for every wanted GPU, none for the others. Each GPU's start is decided
        again under its lock (``ensure_if``): the shares may have changed since the pass read them."""
        supervisor = self.supervisor
        if supervisor is None:
            return
        wanted = set(self._wanted())
        for gpu in sorted(wanted):
            if supervisor.failed_within(gpu, self.retry_seconds):
                continue  # a start failed moments ago: do not hammer it (a create still tries)
            if not supervisor.is_running(gpu) and gpu in supervisor.known():
                log_event(log, "mps.daemon_died", logging.WARNING, gpu=gpu)
            try:  # adopts a daemon an earlier agent left, restarts a dead one, if still wanted
                supervisor.ensure_if(gpu, lambda gpu=gpu: self._still_wanted(gpu))
            except DaemonError:
                pass  # logged by ensure; tried again next pass
        for gpu in sorted(supervisor.known() - wanted):
            supervisor.stop(gpu, keep=lambda gpu=gpu: self._still_wanted(gpu))

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self.reconcile()
            except Exception as error:  # noqa: BLE001 - the watchdog must outlive any one failure
                log_event(log, "mps.reconcile_failed", logging.ERROR, error=str(error)[:300])
            self._wake.wait(self.interval)
            self._wake.clear()

    def close(self) -> None:
        """Stop the watchdog. Daemons keep running: their clients live on across agent restarts."""
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


def find_control(control: str | None) -> str | None:
    """The control executable's path (a path, or a name looked up on PATH), or None."""
    if not control:
        return None
    return shutil.which(control)


def build_sharing(
    control: str | None,
    mps_dir: Path | str = DEFAULT_MPS_DIR,
    compute_mode: ComputeModeHook | None = None,
    node: str = "",
) -> MpsSharing:
    """The node agent's share enforcement: MPS when the control binary is there and the agent can
    give each daemon its own /dev/shm (root, ``unshare``); advisory otherwise, with the reason logged."""
    path = find_control(control)
    reason = ""
    if not control:
        reason = "MPS disabled (--mps-control '')"
    elif path is None:
        reason = f"{control} not found"
    elif os.geteuid() != 0:
        reason = "the node agent is not root (each MPS daemon needs a private /dev/shm mount)"
    elif shutil.which("unshare") is None:
        reason = "unshare (util-linux) not found"
    if reason:
        log_event(log, "mps.unavailable", node=node or None, reason=reason)
        return MpsSharing(None, reason)
    assert path is not None
    log_event(log, "mps.available", node=node or None, control=path, mps_dir=str(mps_dir))
    return MpsSharing(MpsSupervisor(path, mps_dir, compute_mode=compute_mode))


def share_devices(holdings: Iterable[tuple[str, int]]) -> set[str]:
    """Device ids held as shares (milli below a whole GPU) among (device, milli) holdings."""
    return {device for device, milli in holdings if milli < WHOLE}
