"""The MPS supervisor under attack and under races (stand-in control binary, tests/support/mps_standin.py).

A client container can see its GPU's pipe directory, and in the first design could write it: a pid
file naming another GPU's daemon (stale after a crash, or planted) must not make the supervisor
adopt, keep or kill that daemon, and a removed pid file must not make it restart a live one. A
restarted daemon must be reachable from the directories running containers already have mounted,
and the restart must not follow links a tenant planted in the shared /dev/shm. A create that needs
a GPU's daemon while its last share leaves gets a running daemon. The pipe directory works when
mounted read-only, as client containers now get it (a real MPS client does too: docs/gpu-sharing.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crishim.mps import PID_FILE, MpsSharing, MpsSupervisor, client_edits
from tests.fixtures.common import missing_component
from tests.support.mps_standin import events, kill_started, os_pid_alive, write_standin
from tests.support.waiting import wait_for

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


@pytest.fixture
def control(tmp_path: Path) -> Path:
    return write_standin(tmp_path / "bin")


@pytest.fixture
def supervisor(control: Path, tmp_path: Path) -> Iterator[MpsSupervisor]:
    made = MpsSupervisor(
        str(control), tmp_path / "mps", private_shm=False, start_timeout=10.0, stop_timeout=3.0
    )
    yield made
    made.stop_all()
    kill_started(control, signal.SIGKILL)


def kill_daemon(supervisor: MpsSupervisor, gpu: str) -> int:
    pid = supervisor.pid(gpu)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os_pid_alive(pid))
    return pid


def test_a_stale_pid_file_naming_another_gpus_daemon_is_not_adopted(supervisor: MpsSupervisor) -> None:
    supervisor.ensure(GPU_A)
    dirs_b = supervisor.ensure(GPU_B)
    b = supervisor.pid(GPU_B)
    assert b is not None
    kill_daemon(supervisor, GPU_A)  # SIGKILL leaves A's pid file behind...
    supervisor.dirs(GPU_A).pid_file.write_text(f"{b}\n")  # ...and its pid now names B's daemon
    assert not supervisor.is_running(GPU_A)
    supervisor.ensure(GPU_A)  # a new daemon for A, not B's adopted
    assert supervisor.pid(GPU_A) not in (None, b)
    assert supervisor.starts[GPU_A] == 2
    supervisor.stop(GPU_A)
    assert os_pid_alive(b) and supervisor.pid(GPU_B) == b
    assert dirs_b.pid_file.exists()


def test_a_planted_pid_file_cannot_make_stop_kill_another_gpus_daemon(supervisor: MpsSupervisor) -> None:
    supervisor.ensure(GPU_A)
    supervisor.ensure(GPU_B)
    a, b = supervisor.pid(GPU_A), supervisor.pid(GPU_B)
    assert a is not None and b is not None
    # A tenant of GPU A writes B's daemon's pid into A's pid file (it had the pipe directory writable).
    supervisor.dirs(GPU_A).pid_file.write_text(f"{b}\n")
    assert supervisor.pid(GPU_A) == a
    supervisor.stop(GPU_A)  # the last share of A left
    wait_for(lambda: not os_pid_alive(a))
    assert os_pid_alive(b) and supervisor.is_running(GPU_B)
    assert [e["pid"] for e in events(Path(supervisor.control), "exit")] == [a]


def test_a_removed_pid_file_does_not_restart_a_live_daemon(supervisor: MpsSupervisor) -> None:
    supervisor.ensure(GPU_A)
    pid = supervisor.pid(GPU_A)
    supervisor.dirs(GPU_A).pid_file.unlink()  # a tenant removes it
    sharing = MpsSharing(supervisor)
    sharing.start(lambda: {GPU_A})
    sharing.reconcile()
    sharing.close()
    assert supervisor.pid(GPU_A) == pid and supervisor.starts[GPU_A] == 1
    assert len(events(Path(supervisor.control), "started")) == 1


def test_a_daemon_whose_pid_was_reused_is_restarted(supervisor: MpsSupervisor) -> None:
    """The daemon died and its pid now belongs to another process, even one called like the daemon."""
    supervisor.ensure(GPU_A)
    dirs = supervisor.dirs(GPU_A)
    kill_daemon(supervisor, GPU_A)
    impostor = subprocess.Popen(["nvidia-cuda-mps-control", "60"], executable="/bin/sleep")
    try:
        # As if the kernel had handed the daemon's pid to the impostor: every file naming the
        # daemon's pid now names it (the record keeps the daemon's start time).
        dirs.pid_file.write_text(f"{impostor.pid}\n")
        _, start = dirs.record.read_text().split()
        dirs.record.write_text(f"{impostor.pid} {start}\n")
        assert not supervisor.is_running(GPU_A)
        supervisor.ensure(GPU_A)
        assert supervisor.starts[GPU_A] == 2 and supervisor.pid(GPU_A) != impostor.pid
        supervisor.stop(GPU_A)
        assert impostor.poll() is None  # the impostor was neither adopted nor killed
    finally:
        impostor.kill()
        impostor.wait()


def test_a_restarted_daemon_is_reachable_through_directories_clients_have_mounted(
    supervisor: MpsSupervisor,
) -> None:
    dirs = supervisor.ensure(GPU_A)
    # What a running client container holds: the pipe and shm directories themselves (its bind mounts).
    held_pipe = os.open(dirs.pipe, os.O_RDONLY | os.O_DIRECTORY)
    held_shm = os.open(dirs.shm, os.O_RDONLY | os.O_DIRECTORY)
    try:
        kill_daemon(supervisor, GPU_A)
        supervisor.ensure(GPU_A)  # the watchdog's restart
        new = supervisor.pid(GPU_A)
        assert PID_FILE in os.listdir(held_pipe)
        assert Path(f"/proc/self/fd/{held_pipe}/{PID_FILE}").read_text().strip() == str(new)
        assert os.fstat(held_shm).st_ino == dirs.shm.stat().st_ino
        assert os.fstat(held_pipe).st_nlink > 0  # not a removed directory
    finally:
        os.close(held_pipe)
        os.close(held_shm)


def test_a_restart_removes_links_planted_in_shm_without_following_them(
    supervisor: MpsSupervisor, tmp_path: Path
) -> None:
    dirs = supervisor.ensure(GPU_A)
    victim = tmp_path / "victim"
    (victim / "inner").mkdir(parents=True)
    (victim / "inner" / "keep").write_text("host data")
    (dirs.shm / "dir-link").symlink_to(victim)
    (dirs.shm / "file-link").symlink_to(victim / "inner" / "keep")
    (dirs.shm / "real").mkdir()
    (dirs.shm / "real" / "link").symlink_to(victim / "inner")
    kill_daemon(supervisor, GPU_A)
    supervisor.ensure(GPU_A)
    assert os.listdir(dirs.shm) == []
    assert (victim / "inner" / "keep").read_text() == "host data"


def test_a_create_while_the_last_share_leaves_gets_a_running_daemon(
    supervisor: MpsSupervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog is stopping the GPU's daemon (quit in flight) when a create for the GPU reserves
    its share and asks for the daemon: the create waits for the stop and gets a new daemon."""
    supervisor.ensure(GPU_A)
    first = supervisor.pid(GPU_A)
    wanted: set[str] = set()
    quitting, release = threading.Event(), threading.Event()
    real_command = supervisor.command

    def slow_command(gpu: str, text: str, timeout: float | None = None) -> str:
        if text == "quit":
            quitting.set()
            release.wait(10)
        return real_command(gpu, text, timeout)

    monkeypatch.setattr(supervisor, "command", slow_command)
    sharing = MpsSharing(supervisor)
    sharing.start(lambda: set(wanted))
    stopper = threading.Thread(target=sharing.reconcile)  # no shares: stop GPU A
    stopper.start()
    assert quitting.wait(10)
    wanted.add(GPU_A)  # the create reserved its share (the ledger now holds it)...
    got: list[object] = []
    creator = threading.Thread(target=lambda: got.append(supervisor.ensure(GPU_A)))  # ...and needs the daemon
    creator.start()
    creator.join(0.3)
    assert creator.is_alive()  # it waits for the stop in flight
    release.set()
    stopper.join(10)
    creator.join(20)
    sharing.close()
    assert got == [supervisor.dirs(GPU_A)]
    second = supervisor.pid(GPU_A)
    assert second is not None and second != first and first is not None and not os_pid_alive(first)
    assert supervisor.dirs(GPU_A).pipe.is_dir() and supervisor.starts[GPU_A] == 2
    sharing.reconcile()  # the share is still there: the next pass keeps the daemon
    assert supervisor.pid(GPU_A) == second


def test_clients_reach_the_daemon_through_a_read_only_pipe_directory(
    supervisor: MpsSupervisor, control: Path
) -> None:
    if os.geteuid() != 0:
        missing_component("a read-only bind mount needs root")
    dirs = supervisor.ensure(GPU_A)
    (pipe,) = [m for m in client_edits(dirs, 250, 0).mounts if m.host_path == str(dirs.pipe)]
    assert pipe.readonly and pipe.container_path == str(dirs.pipe)
    # A client in its own mount namespace with the pipe directory read-only, as in its container.
    script = (
        'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && '
        '(rm -f "$1/nvidia-cuda-mps-control.pid" 2>/dev/null && echo removed || echo refused) && '
        'echo get_server_list | "$2"'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "client", str(dirs.pipe),
         str(control)],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, **client_edits(dirs, 250, 0).env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "refused"
    wait_for(lambda: [c["command"] for c in events(control, "command")] == ["get_server_list"])
    assert dirs.pid_file.exists()
