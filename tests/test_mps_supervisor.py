"""The MPS daemon supervisor and the node's share policy against a stand-in control binary.

The stand-in (tests/support/mps_standin.py) forks like ``nvidia-cuda-mps-control -d``, writes its
pid file and FIFO in the pipe directory, answers ``quit`` from the control client, and records
every start, command and exit; these tests read that record and the processes themselves.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crishim.mps import (
    DaemonDirs,
    DaemonError,
    MpsSharing,
    MpsSupervisor,
    ShareRefused,
    active_thread_percentage,
    build_sharing,
    client_edits,
    share_devices,
    share_memory_mib,
)
from devices.model import Device, DeviceKind, NodeInventory, Sharing
from devices.plugin import Mount
from kubegpu.allocation import Share
from tests.fixtures.common import missing_component
from tests.support.mps_standin import events, os_pid_alive, write_standin
from tests.support.waiting import wait_for

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


def gpu(uuid: str, index: int = 0, memory: int = 81920) -> Device:
    return Device(uuid, DeviceKind.GPU, index, "NVIDIA H100 80GB HBM3", memory_mib=memory)


NIC = Device("mlx5_0", DeviceKind.RDMA, 0, "MT4123")


@pytest.fixture
def control(tmp_path: Path) -> Path:
    return write_standin(tmp_path / "bin")


@pytest.fixture
def supervisors(control: Path, tmp_path: Path) -> Iterator[list[MpsSupervisor]]:
    """Supervisors made by the test; every daemon they know is stopped afterwards."""
    made: list[MpsSupervisor] = []
    yield made
    for supervisor in made:
        supervisor.stop_all()


def make(supervisors: list[MpsSupervisor], control: Path, root: Path, **kwargs: object) -> MpsSupervisor:
    options: dict[str, object] = {"private_shm": False, "start_timeout": 10.0, "stop_timeout": 5.0}
    options.update(kwargs)
    supervisor = MpsSupervisor(str(control), root, **options)  # type: ignore[arg-type]
    supervisors.append(supervisor)
    return supervisor


# --- pure parts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("milli", "percent"), [(1, 1), (9, 1), (10, 1), (11, 2), (250, 25), (333, 34), (999, 100)]
)
def test_active_thread_percentage_rounds_up(milli: int, percent: int) -> None:
    assert active_thread_percentage(milli) == percent


def test_client_edits_env_and_mounts(tmp_path: Path) -> None:
    dirs = DaemonDirs(tmp_path / GPU_A)
    edits = client_edits(dirs, 250, 4096)
    assert dict(edits.env) == {
        "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
    }
    assert edits.mounts == (
        Mount(str(dirs.pipe), str(dirs.pipe), readonly=True),  # the same paths as the daemon's
        Mount(str(dirs.log), str(dirs.log), readonly=True),
        Mount(str(dirs.shm), "/dev/shm", readonly=False),
    )
    assert not edits.device_nodes and not edits.cdi_devices
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in client_edits(dirs, 500, 0).env  # memory unknown


def test_share_memory_defaults_to_the_milli_fraction_of_the_gpu() -> None:
    assert share_memory_mib(Share(250, 4096), gpu(GPU_A)) == 4096
    assert share_memory_mib(Share(250), gpu(GPU_A, memory=81920)) == 20480
    assert share_memory_mib(Share(250), gpu(GPU_A, memory=0)) == 0


def test_share_devices_are_the_fractional_holdings() -> None:
    assert share_devices([("a", 250), ("b", 1000), ("a", 500), ("c", 999)]) == {"a", "c"}


def test_gpu_ids_that_cannot_name_a_directory_are_refused(tmp_path: Path) -> None:
    supervisor = MpsSupervisor("/bin/true", tmp_path)
    for bad in ("../etc", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(DaemonError):
            supervisor.dirs(bad)


# --- the supervisor ------------------------------------------------------------------------------


def test_ensure_starts_one_daemon_per_gpu_with_its_directories(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    supervisor = make(supervisors, control, tmp_path / "mps")
    dirs = supervisor.ensure(GPU_A)
    assert dirs == DaemonDirs(tmp_path / "mps" / GPU_A)
    pid = supervisor.pid(GPU_A)
    assert pid is not None and os_pid_alive(pid)
    (started,) = events(control, "started")
    assert started["pid"] == pid
    assert started["visible"] == GPU_A
    assert (started["pipe"], started["log"]) == (str(dirs.pipe), str(dirs.log))
    assert "standin control daemon" in (dirs.log / "control.log").read_text()
    assert oct(dirs.shm.stat().st_mode & 0o7777) == oct(0o1777)
    # Idempotent: a running daemon is not started again; another GPU gets its own.
    assert supervisor.ensure(GPU_A) == dirs
    supervisor.ensure(GPU_B)
    assert sorted(e["visible"] for e in events(control, "started")) == [GPU_A, GPU_B]
    assert supervisor.known() == {GPU_A, GPU_B}


def test_concurrent_first_uses_start_one_daemon(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    supervisor = make(supervisors, control, tmp_path / "mps")
    errors: list[BaseException] = []

    def use() -> None:
        try:
            supervisor.ensure(GPU_A)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(events(control, "started")) == 1
    assert supervisor.starts[GPU_A] == 1


def test_stop_sends_quit_and_removes_the_directories(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    supervisor = make(supervisors, control, tmp_path / "mps")
    dirs = supervisor.ensure(GPU_A)
    pid = supervisor.pid(GPU_A)
    assert pid is not None
    assert supervisor.stop(GPU_A, keep=lambda: True) is False  # still wanted: nothing happens
    assert os_pid_alive(pid)
    assert supervisor.stop(GPU_A) is True
    assert [c["commands"] for c in events(control, "client")] == [["quit"]]
    assert [c["command"] for c in events(control, "command")] == ["quit"]
    assert [e["pid"] for e in events(control, "exit")] == [pid]
    wait_for(lambda: not os_pid_alive(pid))
    assert not dirs.root.exists()
    assert supervisor.known() == set()
    assert supervisor.stop(GPU_A) is True  # stopping a stopped GPU is harmless


def test_a_daemon_that_ignores_quit_is_killed(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_IGNORE_QUIT", "1")
    supervisor = make(supervisors, control, tmp_path / "mps", stop_timeout=1.0)
    supervisor.ensure(GPU_A)
    pid = supervisor.pid(GPU_A)
    assert pid is not None
    supervisor.stop(GPU_A)
    wait_for(lambda: not os_pid_alive(pid))
    assert [c["command"] for c in events(control, "command")] == ["quit"]
    assert [e["pid"] for e in events(control, "exit")] == [pid]  # it got SIGTERM after the quit


def test_start_failure_names_the_gpu_and_the_reason(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_FAIL", "start")
    supervisor = make(supervisors, control, tmp_path / "mps")
    with pytest.raises(DaemonError, match=f"GPU {GPU_A}: .* exited with 1: standin: cannot start"):
        supervisor.ensure(GPU_A)
    assert "cannot start" in supervisor.failing(GPU_A)
    sharing = MpsSharing(supervisor)
    assert sharing.mode(gpu(GPU_A)) is Sharing.ADVISORY  # advertised as not enforced while it fails
    assert sharing.mode(gpu(GPU_B)) is Sharing.MPS
    monkeypatch.delenv("STANDIN_FAIL")
    supervisor.ensure(GPU_A)  # it works again: enforced again
    assert supervisor.failing(GPU_A) == ""
    assert sharing.mode(gpu(GPU_A)) is Sharing.MPS


def test_failure_is_forgotten_after_retry_after(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_FAIL", "start")
    supervisor = make(supervisors, control, tmp_path / "mps", retry_after=0.0)
    with pytest.raises(DaemonError):
        supervisor.ensure(GPU_A)
    assert supervisor.failing(GPU_A) == ""


def test_a_daemon_that_vanishes_is_a_failed_start(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_FAIL", "vanish")
    supervisor = make(supervisors, control, tmp_path / "mps", start_timeout=1.0)
    with pytest.raises(DaemonError, match="left no live daemon"):
        supervisor.ensure(GPU_A)
    assert supervisor.failing(GPU_A)


def test_a_daemon_without_pid_file_is_a_failed_start_and_is_cleaned_up(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_FAIL", "nopid")
    supervisor = make(supervisors, control, tmp_path / "mps", start_timeout=1.0)
    with pytest.raises(DaemonError, match="left no live daemon"):
        supervisor.ensure(GPU_A)
    (started,) = events(control, "started")
    wait_for(lambda: not os_pid_alive(int(started["pid"])))  # type: ignore[call-overload]


def test_missing_control_binary_fails_the_start(supervisors: list[MpsSupervisor], tmp_path: Path) -> None:
    supervisor = make(supervisors, tmp_path / "nowhere" / "nvidia-cuda-mps-control", tmp_path / "mps")
    with pytest.raises(DaemonError, match="cannot start"):
        supervisor.ensure(GPU_A)


def test_compute_mode_is_exclusive_while_the_daemon_runs(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    calls: list[tuple[str, bool]] = []
    supervisor = make(
        supervisors, control, tmp_path / "mps", compute_mode=lambda g, exclusive: calls.append((g, exclusive))
    )
    supervisor.ensure(GPU_A)
    assert calls == [(GPU_A, True)]
    supervisor.stop(GPU_A)
    assert calls == [(GPU_A, True), (GPU_A, False)]


def test_compute_mode_refused_means_no_daemon(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    def refuse(gpu_id: str, exclusive: bool) -> None:
        raise RuntimeError("Insufficient Permissions")

    supervisor = make(supervisors, control, tmp_path / "mps", compute_mode=refuse)
    with pytest.raises(DaemonError, match="EXCLUSIVE_PROCESS.*Insufficient Permissions"):
        supervisor.ensure(GPU_A)
    assert events(control, "started") == []


def test_a_new_supervisor_adopts_running_daemons(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    first = make(supervisors, control, tmp_path / "mps")
    first.ensure(GPU_A)
    pid = first.pid(GPU_A)
    second = make(supervisors, control, tmp_path / "mps")  # the agent restarted
    assert second.known() == {GPU_A}
    second.ensure(GPU_A)
    assert second.pid(GPU_A) == pid
    assert len(events(control, "started")) == 1


def test_private_shm_gives_the_daemon_its_own_dev_shm(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        missing_component("a private /dev/shm mount needs root")
    monkeypatch.setenv("STANDIN_SHM_MARKER", "1")
    supervisor = make(supervisors, control, tmp_path / "mps", private_shm=True)
    dirs = supervisor.ensure(GPU_A)
    (started,) = events(control, "started")
    shm = dirs.shm.stat()
    assert started["shm"] == [shm.st_dev, shm.st_ino]
    marker = f"kubegpu-standin-{started['pid']}"
    assert (dirs.shm / marker).exists()
    assert not (Path("/dev/shm") / marker).exists()
    supervisor.stop(GPU_A)  # the control client reaches the daemon from its own namespace too
    assert [c["command"] for c in events(control, "command")] == ["quit"]
    assert not dirs.root.exists()


# --- the node's policy and its watchdog ------------------------------------------------------------


def test_container_edits_make_a_share_an_mps_client(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    supervisor = make(supervisors, control, tmp_path / "mps")
    sharing = MpsSharing(supervisor)
    edits = asyncio.run(sharing.container_edits([gpu(GPU_A), NIC], {GPU_A: Share(500, 8192)}))
    assert edits == client_edits(supervisor.dirs(GPU_A), 500, 8192)
    assert supervisor.is_running(GPU_A)
    # Whole GPUs are no MPS clients; neither is a share of the whole GPU.
    assert asyncio.run(sharing.container_edits([gpu(GPU_B)], {})).is_empty()
    assert asyncio.run(sharing.container_edits([gpu(GPU_B)], {GPU_B: Share(1000)})).is_empty()
    assert not supervisor.is_running(GPU_B)


def test_a_share_beside_another_gpu_cannot_be_enforced(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    sharing = MpsSharing(make(supervisors, control, tmp_path / "mps"))
    with pytest.raises(ShareRefused, match="exactly one GPU"):
        asyncio.run(sharing.container_edits([gpu(GPU_A), gpu(GPU_B, 1)], {GPU_A: Share(500)}))
    assert events(control, "started") == []


def test_advisory_node_adds_nothing_and_says_so() -> None:
    sharing = MpsSharing(None, "nvidia-cuda-mps-control not found")
    assert asyncio.run(sharing.container_edits([gpu(GPU_A)], {GPU_A: Share(500)})).is_empty()
    inventory = sharing.annotate(NodeInventory((gpu(GPU_A), NIC)))
    assert [d.attributes.get("sharing") for d in inventory.devices] == ["advisory", None]
    assert not inventory.devices[0].share_enforced


def test_annotate_marks_enforcing_gpus(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    sharing = MpsSharing(make(supervisors, control, tmp_path / "mps"))
    inventory = sharing.annotate(NodeInventory((gpu(GPU_A), gpu(GPU_B, 1), NIC)))
    assert [d.attributes.get("sharing") for d in inventory.devices] == ["mps", "mps", None]
    assert inventory.devices[0].share_enforced
    again = NodeInventory.from_public(inventory.public())
    assert again.devices[1].share_enforced


def test_watchdog_follows_the_wanted_gpus_and_restarts_dead_daemons(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    supervisor = make(supervisors, control, tmp_path / "mps")
    wanted: set[str] = set()
    sharing = MpsSharing(supervisor, interval=0.1)
    sharing.start(lambda: set(wanted))
    try:
        wanted.add(GPU_A)
        sharing.poke()
        wait_for(lambda: supervisor.starts[GPU_A] == 1)
        pid = supervisor.pid(GPU_A)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the daemon dies: the watchdog starts a new one
        wait_for(lambda: supervisor.starts[GPU_A] == 2)
        assert supervisor.is_running(GPU_A) and supervisor.pid(GPU_A) != pid
        wanted.clear()  # the last share left
        sharing.poke()
        wait_for(lambda: not supervisor.is_running(GPU_A) and GPU_A not in supervisor.known())
        assert [c["command"] for c in events(control, "command")] == ["quit"]
    finally:
        sharing.close()


def test_watchdog_stops_daemons_an_earlier_agent_left_without_shares(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path
) -> None:
    make(supervisors, control, tmp_path / "mps").ensure(GPU_A)
    later = MpsSharing(make(supervisors, control, tmp_path / "mps"))
    later.start(frozenset)  # rebuilt ledger: no shares of GPU_A any more
    later.reconcile()
    later.close()
    assert not later.supervisor.is_running(GPU_A)  # type: ignore[union-attr]
    assert len(events(control, "exit")) == 1


def test_build_sharing_says_why_shares_are_advisory(tmp_path: Path, control: Path) -> None:
    assert build_sharing("", tmp_path).reason == "MPS disabled (--mps-control '')"
    assert build_sharing(str(tmp_path / "absent"), tmp_path).reason.endswith("not found")
    sharing = build_sharing(str(control), tmp_path)
    if os.geteuid() == 0:
        assert sharing.enforced and sharing.supervisor is not None
        assert sharing.supervisor.control == str(control)
    else:
        assert "not root" in sharing.reason


def test_mps_module_imports_without_grpc() -> None:
    """The GPU proof runs crishim.mps where no CRI stubs exist: it must not import them."""
    import subprocess
    import sys

    code = (
        "import sys, crishim.mps, kubegpu.gpu_proof; "
        "bad = sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('grpc', 'kubernetes') or m.startswith('crishim.cri')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_supervisor_environment_drops_inherited_mps_settings(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/elsewhere")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    supervisor = make(supervisors, control, tmp_path / "mps")
    dirs = supervisor.ensure(GPU_A)
    (started,) = events(control, "started")
    assert started["pipe"] == str(dirs.pipe) and started["visible"] == GPU_A


def test_watchdog_pauses_after_a_failed_start_but_a_create_still_tries(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_FAIL", "start")
    supervisor = make(supervisors, control, tmp_path / "mps")
    attempts: list[str] = []
    real_start = supervisor._start

    def counted(gpu_id: str, dirs: DaemonDirs) -> int:
        attempts.append(gpu_id)
        return real_start(gpu_id, dirs)

    monkeypatch.setattr(supervisor, "_start", counted)
    sharing = MpsSharing(supervisor, interval=0.05, retry_seconds=60.0)
    sharing.start(lambda: {GPU_A})
    try:
        wait_for(lambda: len(attempts) == 1)
        for _ in range(5):
            sharing.poke()
            threading.Event().wait(0.1)
        assert attempts == [GPU_A]  # no retry within retry_seconds
        with pytest.raises(DaemonError):
            asyncio.run(sharing.container_edits([gpu(GPU_A)], {GPU_A: Share(500)}))
        assert attempts == [GPU_A, GPU_A]  # kubelet's retry of a create does try again
    finally:
        sharing.close()


def test_the_watchdog_starts_no_daemon_for_a_gpu_that_is_now_held_whole(
    supervisors: list[MpsSupervisor], control: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass reads the wanted GPUs (GPU_A: a share holds it, and its daemon has died). Before the
    pass gets to GPU_A, the last share leaves and a container takes GPU_A whole (its create stops
    what is left of the daemon). The pass must not start a daemon for GPU_A: that would put the
    GPU in EXCLUSIVE_PROCESS beside the whole-GPU container."""
    modes: list[tuple[str, bool]] = []
    supervisor = make(
        supervisors, control, tmp_path / "mps", compute_mode=lambda g, on: modes.append((g, on))
    )
    sharing = MpsSharing(supervisor)
    supervisor.ensure(GPU_A)
    pid = supervisor.pid(GPU_A)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not supervisor.is_running(GPU_A))
    shares = {GPU_A}
    reads = 0

    def wanted() -> set[str]:
        nonlocal reads
        reads += 1
        seen = set(shares)
        if reads == 1:  # the pass has read it: now the share leaves and GPU_A is created whole
            shares.clear()
            assert asyncio.run(sharing.container_edits([gpu(GPU_A)], {})).env == {}
        return seen

    sharing._wanted = wanted  # what start() installs, without the watchdog's own thread
    caplog.set_level(logging.INFO)
    sharing.reconcile()
    skipped = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "mps.start_skipped"]
    assert skipped == [{"gpu": GPU_A, "reason": "no share of the GPU is held any more"}]
    assert supervisor.starts[GPU_A] == 1 and not supervisor.is_running(GPU_A)
    assert GPU_A not in supervisor.known() and len(events(control, "started")) == 1
    assert modes == [(GPU_A, True), (GPU_A, False)]  # back to DEFAULT, and left there
    shares.add(GPU_A)  # a share again: the next pass does start its daemon
    sharing.reconcile()
    assert supervisor.starts[GPU_A] == 2 and supervisor.is_running(GPU_A)
