"""The local cluster's building blocks on their own: decisions, process records, the node namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from devices.model import PCIeRelation, Topology
from kubegpu.localcluster.cluster import LocalClusterError, check_state_dir
from kubegpu.localcluster.kubelet import KubeletError, default_route_interface, kubelet_config, node_ip
from kubegpu.localcluster.namespace import KUBELET_TUNABLES, MountNamespace, read_tunables, restore_tunables
from kubegpu.localcluster.processes import (
    ProcessRecord,
    absent_cgroup_parents,
    mount_namespace,
    mounts_under,
    processes_of,
    remove_cgroups,
    sweep,
)
from kubegpu.localcluster.workload import PodReport, format_table, link_summary

ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth1\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
"""


def test_the_node_ip_comes_from_the_default_route_interface(tmp_path: Path) -> None:
    routes = tmp_path / "route"
    routes.write_text(ROUTES)
    assert default_route_interface(routes) == "eth0"
    routes.write_text(ROUTES.splitlines()[0] + "\n" + ROUTES.splitlines()[1] + "\n")
    with pytest.raises(KubeletError, match="no IPv4 default route"):
        default_route_interface(routes)
    assert not node_ip().startswith("127.")


def test_kubelet_config_is_what_these_machines_need(tmp_path: Path) -> None:
    config = kubelet_config(address="192.0.2.2", port=1, healthz_port=2, runtime_endpoint="unix:///x.sock",
                            client_ca=tmp_path / "ca", tls_cert=tmp_path / "c", tls_key=tmp_path / "k",
                            volume_plugin_dir=tmp_path / "plugins")
    assert config["volumePluginDir"] == str(tmp_path / "plugins")  # kubelet creates it: not on the host
    assert config["failCgroupV1"] is False and config["cgroupsPerQOS"] is False
    assert config["cgroupDriver"] == "cgroupfs" and config["enforceNodeAllocatable"] == []
    assert config["makeIPTablesUtilChains"] is False  # no iptables chains on the host
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook" and config["readOnlyPort"] == 0
    assert config["containerRuntimeEndpoint"] == config["imageServiceEndpoint"] == "unix:///x.sock"


def test_state_dirs_a_node_would_hide_or_too_long_for_sockets_are_refused(tmp_path: Path) -> None:
    for hidden in ("/var/lib/k", "/var/log", "/var/log/x/y"):
        with pytest.raises(LocalClusterError, match="private inside a node"):
            check_state_dir(Path(hidden))
    with pytest.raises(LocalClusterError, match="too long"):
        check_state_dir(tmp_path / ("d" * 80))
    assert check_state_dir(Path("relative")) == Path.cwd() / "relative"


def test_link_summary_and_table() -> None:
    topology = Topology(nvlinks={("a", "b"): 2, ("a", "c"): 1, ("b", "c"): 1},
                        pcie={("a", "d"): PCIeRelation.SYS, ("b", "d"): PCIeRelation.PIX})
    assert link_summary(topology, ["a"]) == "-"
    assert link_summary(topology, ["a", "b"]) == "NVLink (2 links)"
    assert link_summary(topology, ["a", "b", "c"]) == "NVLink on all 3 pairs (4 links)"
    assert link_summary(topology, ["a", "b", "d"]) == "NVLink on 1/3 pairs; weakest path SYS"
    table = format_table([PodReport("p", "Running", "gpu0 gpu1", "whole", "NVLink (2 links)", "gpu0 gpu1")])
    header, row = table.splitlines()
    assert header.split() == ["POD", "PHASE", "GPUS", "SHARE", "LINKS", "CONTAINER", "SEES"]
    assert row.index("Running") == header.index("PHASE")


def _spawn(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), start_new_session=True)


def test_a_record_stops_its_process_group_and_never_a_reused_pid() -> None:
    process = _spawn("sh", "-c", "sleep 100 & wait")
    record = ProcessRecord.of("t", process.pid)
    impostor = ProcessRecord("t", process.pid, record.start_time + 1)  # same pid, another start
    impostor.stop(timeout=0.5)
    assert record.alive()  # a record whose start time differs never signals
    record.stop(timeout=5)
    assert not record.alive() and process.poll() is not None
    assert ProcessRecord.from_dict(record.as_dict()) == record


def test_sweep_finds_processes_by_state_dir_and_their_descendants(tmp_path: Path) -> None:
    marker = tmp_path / "state"
    marker.mkdir()
    other = tmp_path / "state2"  # a sibling whose name starts the same is not ours
    other.mkdir()
    stranger = _spawn("sh", "-c", "sleep 100", str(other / "config"))
    parent = _spawn("sh", "-c", "sleep 100 & sleep 100 & wait", str(marker / "config"))
    deadline = time.monotonic() + 5
    while len(processes_of(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_of(marker)) == 3  # sh (its argv names the dir) and its two sleeps
    killed = sweep(marker)
    assert parent.pid in killed and processes_of(marker) == set()
    parent.wait(timeout=5)
    assert stranger.poll() is None
    stranger.kill()
    stranger.wait()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_the_node_namespace_keeps_kubelets_paths_and_tunables_off_the_host(tmp_path: Path) -> None:
    host = read_tunables()
    assert set(host) <= set(KUBELET_TUNABLES) and "vm/overcommit_memory" in host
    namespace = MountNamespace(tmp_path / "node").start()
    try:
        assert namespace.namespace_id != mount_namespace(os.getpid())
        flipped = "1" if host["vm/overcommit_memory"] != "1" else "0"
        script = (f"echo {flipped} > /proc/sys/vm/overcommit_memory; cat /proc/sys/vm/overcommit_memory; "
                  "mkdir -p /var/lib/kubelet && touch /var/lib/kubelet/x /var/log/y")
        inside = subprocess.run(namespace.enter(["sh", "-c", script]), capture_output=True, text=True,
                                timeout=20)
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout.strip() == flipped  # kubelet would read back what it wrote
        assert read_tunables() == host  # the host never changed
        assert (tmp_path / "node" / "var-lib" / "kubelet" / "x").exists()
        assert (tmp_path / "node" / "var-log" / "y").exists()
        assert not Path("/var/log/y").exists()
        assert mounts_under(tmp_path) == []  # the mounts exist only inside the namespace
    finally:
        changed = namespace.stop()
    assert changed == {} and not namespace.alive()
    assert processes_of(tmp_path, [namespace.namespace_id or ""]) == set()
    assert restore_tunables(host) == {}


def test_stop_signals_group_members_too() -> None:
    process = _spawn("sh", "-c", "trap '' TERM; sleep 100 & wait")  # ignores SIGTERM: SIGKILL follows
    record = ProcessRecord.of("stubborn", process.pid)
    record.stop(timeout=1)
    assert not record.alive()
    process.wait(timeout=5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the whole group goes, the background sleep included
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("a member of the stopped process group survived")


def test_containerd_cgroup_parents_made_by_the_cluster_are_removed_when_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubegpu.localcluster import processes

    for hierarchy in ("memory", "pids"):
        (tmp_path / hierarchy).mkdir()
        (tmp_path / hierarchy / "cgroup.procs").touch()
    (tmp_path / "pids" / processes.CONTAINERD_CGROUP).mkdir()  # there before the cluster
    monkeypatch.setattr(processes, "CGROUP_ROOT", tmp_path)
    made = absent_cgroup_parents()
    assert made == [str(tmp_path / processes.CONTAINERD_CGROUP), str(tmp_path / "memory" / "k8s.io")]
    (tmp_path / "memory" / "k8s.io" / "busy").mkdir(parents=True)  # still holds a container
    assert remove_cgroups(made) == [str(tmp_path / "memory" / "k8s.io")]
    (tmp_path / "memory" / "k8s.io" / "busy").rmdir()
    assert remove_cgroups(made) == []
    assert not (tmp_path / "memory" / "k8s.io").exists() and (tmp_path / "pids" / "k8s.io").exists()


def test_the_first_up_shows_build_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from kubegpu.devenv.controlplane import BinariesMissing
    from kubegpu.localcluster import cli

    monkeypatch.setattr(cli, "HEARTBEAT_SECONDS", 0.5)
    script = tmp_path / "build.sh"
    script.write_text("echo 'testbin: building kubelet (k8s.io/kubernetes/cmd/kubelet) ...'; sleep 2.5\n"
                      "echo 'testbin: built kubelet in 2s'\n")
    out = io.StringIO()
    cli.build_binaries(script, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "  testbin: building kubelet (k8s.io/kubernetes/cmd/kubelet) ..."
    assert any(line.startswith("  ... still building kubelet") for line in lines[1:-1]), lines
    assert lines[-1] == "  testbin: built kubelet in 2s"
    script.write_text("echo 'go: no network' >&2; exit 3\n")
    with pytest.raises(BinariesMissing, match=r"failed \(exit 3\)"):
        cli.build_binaries(script, io.StringIO())


def test_what_a_killed_containerds_shims_kept_on_the_host_is_found_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the containers of this containerd (its bundles) are named; a busy cgroup stays."""
    from kubegpu.localcluster import processes

    run, cgroups, state = tmp_path / "run-containerd", tmp_path / "cgroup", tmp_path / "state"
    monkeypatch.setattr(processes, "RUN_CONTAINERD", run)
    monkeypatch.setattr(processes, "CGROUP_ROOT", cgroups)
    (cgroups / "memory").mkdir(parents=True)
    (cgroups / "memory" / "cgroup.procs").touch()
    ours, busy, theirs = "a" * 64, "b" * 64, "c" * 64
    for cid in (ours, busy):
        bundle = state / processes.TASKS / "k8s.io" / cid
        bundle.mkdir(parents=True)
        (bundle / "address").write_text(f"unix://{run}/s/{cid[:8]}")
    (state / processes.TASKS / "k8s.io" / ours / "address").write_text("unix:///elsewhere/sock")
    for cid in (ours, busy, theirs):
        (run / "runc" / "k8s.io" / cid).mkdir(parents=True)
        (run / "runc" / "k8s.io" / cid / "state.json").write_text("{}")
        (run / "s").mkdir(exist_ok=True)
        (run / "s" / cid[:8]).touch()
        (cgroups / "memory" / "k8s.io" / cid).mkdir(parents=True)
    (cgroups / "memory" / "k8s.io" / busy / "child").mkdir()  # rmdir refuses: still in use

    assert sorted(map(str, processes.runtime_remains(state))) == sorted([
        f"{run}/runc/k8s.io/{ours}", f"{cgroups}/memory/k8s.io/{ours}",
        f"{run}/s/{busy[:8]}", f"{run}/runc/k8s.io/{busy}", f"{cgroups}/memory/k8s.io/{busy}",
    ])  # an address outside /run/containerd/s is never touched
    assert processes.remove_runtime_remains(state) == [f"{cgroups}/memory/k8s.io/{busy}"]
    assert [str(p) for p in processes.runtime_remains(state)] == [f"{cgroups}/memory/k8s.io/{busy}"]
    assert (run / "runc" / "k8s.io" / theirs).exists() and (run / "s" / theirs[:8]).exists()
    assert (cgroups / "memory" / "k8s.io" / theirs).exists() and (run / "s" / ours[:8]).exists()
