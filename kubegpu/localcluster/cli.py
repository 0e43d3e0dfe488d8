"""``kubegpu up`` and ``kubegpu down``: a GPU cluster of real nodes on this machine (``make demo``).

``up`` builds the Kubernetes binaries on first use (showing progress), starts etcd,
kube-apiserver, kube-controller-manager, the kubegpu scheduler and ``--nodes`` nodes (default 1),
each with its own containerd, kubegpu shim with 8 simulated DGX-1 GPUs and kubelet, prints the
kubeconfig, and runs the demo workload on the first node (workload.py). The cluster keeps
running after ``up`` returns; ``down`` stops it and leaves nothing behind: no process, no mount,
no changed sysctl, no file outside the state directory (whose ``logs/`` it keeps). Both need
root (mount namespaces, containerd).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from kubegpu.cliargs import EXIT_FAILURE, EXIT_USAGE, absent_or_directory, count, one_line

# Imports of the cluster modules (kubernetes client, ...) happen in the commands, so that every
# other kubegpu subcommand starts without them.
REPO_ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_SECONDS = 15.0
NODE_NAME = "kubegpu-node"
MAX_NODES = 8  # each node is a containerd, a shim and a kubelet: a few hundred MiB and some CPU


def node_names(nodes: int) -> list[str]:
    """``kubegpu-node`` for the first node (the one-node demo's name), then ``kubegpu-node-2``, ..."""
    return [NODE_NAME] + [f"{NODE_NAME}-{i}" for i in range(2, nodes + 1)]


def default_state_dir() -> Path:
    """$KUBEGPU_STATE_DIR, else $XDG_STATE_HOME/kubegpu/cluster (~/.local/state by default)."""
    if os.environ.get("KUBEGPU_STATE_DIR"):
        return Path(os.environ["KUBEGPU_STATE_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "kubegpu" / "cluster"


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser(
        "up",
        help="start a GPU cluster of real nodes on this machine (the demo; needs root)",
        description="Start etcd, kube-apiserver, kube-controller-manager, containerd, the kubegpu shim "
        "with simulated DGX-1 GPUs, kubelet and the kubegpu scheduler; run a small mixed workload.",
    )
    up.add_argument("--state-dir", type=absent_or_directory, default=None, help="where everything lives "
                    "(default: $KUBEGPU_STATE_DIR or ~/.local/state/kubegpu/cluster)")
    up.add_argument("--containerd", choices=["debian", "2"], default="debian",
                    help="Debian's containerd 1.6 (default) or the Go-built 2.x (built on first use)")
    up.add_argument("--nodes", type=count(1, MAX_NODES), default=1, metavar="N",
                    help=f"how many nodes (1..{MAX_NODES}, default 1), named {NODE_NAME}, "
                    f"{NODE_NAME}-2, ...; each runs its own containerd, kubegpu shim (8 simulated GPUs) "
                    "and kubelet")
    up.add_argument("--front", choices=["cri", "nri"], default="cri",
                    help="how the node agent meets containerd: cri, a CRI proxy kubelet talks to "
                    "(default), or nri, containerd's required NRI plugin (needs --containerd 2)")
    up.add_argument("--no-workload", action="store_true", help="start the cluster only")
    up.set_defaults(run=run_up)
    down = sub.add_parser(
        "down",
        help="stop the cluster `kubegpu up` started and remove it (logs are kept)",
        description="Stop every process, unmount, restore sysctls, delete the state dir except logs/.",
    )
    down.add_argument("--state-dir", type=absent_or_directory, default=None, help="as given to `kubegpu up`")
    down.set_defaults(run=run_down)


def _fail(command: str, message: str, status: int = EXIT_USAGE) -> int:
    """One stderr line; exit 2 for what the user gave or must fix first, 1 for a failure (errors.md)."""
    print(f"kubegpu {command}: {one_line(message)}", file=sys.stderr)
    return status


def build_binaries(script: Path, out: object = sys.stdout) -> None:
    """Run a testbin build script, echoing its lines and a heartbeat while a binary builds."""
    from kubegpu.devenv.controlplane import BinariesMissing

    start = time.monotonic()
    process = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=REPO_ROOT)
    assert process.stdout is not None
    last = [time.monotonic(), ""]

    def heartbeat() -> None:
        while process.poll() is None:
            time.sleep(1)
            if time.monotonic() - last[0] >= HEARTBEAT_SECONDS and process.poll() is None:
                print(f"  ... still {last[1] or 'building'} ({time.monotonic() - start:.0f}s so far)",
                      file=out, flush=True)  # type: ignore[call-overload]
                last[0] = time.monotonic()

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    for line in process.stdout:
        print("  " + line.rstrip(), file=out, flush=True)  # type: ignore[call-overload]
        if "building" in line:
            last[1] = line.split("testbin: ", 1)[-1].strip().rstrip(" .")
        last[0] = time.monotonic()
    if process.wait() != 0:
        raise BinariesMissing(f"{script} failed (exit {process.returncode})")
    beat.join(timeout=2)


def run_up(args: argparse.Namespace) -> int:
    from kubegpu.devenv.containerd import containerd2_bin_dir
    from kubegpu.devenv.controlplane import BinariesMissing
    from kubegpu.localcluster import workload
    from kubegpu.localcluster.cluster import (
        LocalCluster,
        LocalClusterError,
        check_state_dir,
        find_cluster_binaries,
    )

    if os.geteuid() != 0:
        return _fail("up", "needs root (it makes mount namespaces and runs containerd and kubelet)")
    if args.front == "nri" and args.containerd != "2":
        return _fail("up", "--front nri needs --containerd 2 (containerd 1.6 has no NRI to speak of)")
    try:
        state_dir = check_state_dir(args.state_dir or default_state_dir())
    except LocalClusterError as exc:
        return _fail("up", str(exc))
    started = time.monotonic()

    def progress(step: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {step}", flush=True)

    try:
        binaries = find_cluster_binaries()
    except BinariesMissing:
        progress("building the Kubernetes binaries (first run only; about 10 minutes on 2 cores)")
        try:
            build_binaries(REPO_ROOT / "tests" / "cluster" / "build.sh")
            binaries = find_cluster_binaries()
        except BinariesMissing as exc:
            return _fail("up", str(exc), EXIT_FAILURE)
    bin_dir = None
    if args.containerd == "2":
        bin_dir = containerd2_bin_dir()
        if bin_dir is None:
            progress("building containerd 2.x (first run only)")
            build_binaries(REPO_ROOT / "tests" / "containerd" / "build.sh")
            bin_dir = containerd2_bin_dir()
    elif shutil.which("containerd") is None:
        return _fail("up", "containerd not found (apt-get install containerd runc, or --containerd 2)")
    cluster = LocalCluster(state_dir, binaries)
    try:
        cluster.start(progress=progress)
        for name in node_names(args.nodes):
            progress(f"node {name}: containerd, kubegpu crishim (8 simulated DGX-1 V100 GPUs), kubelet")
            cluster.add_node(name, containerd_bin_dir=bin_dir,
                             proxy="kubegpu-nri" if args.front == "nri" else "kubegpu")
    except (LocalClusterError, OSError, RuntimeError) as exc:
        started = cluster._started  # False: the state dir was refused before anything started
        cluster.stop()
        return _fail("up", f"could not start the cluster: {exc}", EXIT_FAILURE if started else EXIT_USAGE)
    detach(cluster)
    progress("ready")
    kubectl = f"{binaries.kubectl} --kubeconfig {cluster.admin_kubeconfig}"
    print(f"\nkubeconfig: {cluster.admin_kubeconfig}")
    print(f"  export KUBECONFIG={cluster.admin_kubeconfig}")
    print(f"  {kubectl} get nodes")
    print(f"logs: {state_dir}")
    status = 0
    if not args.no_workload:
        try:
            status = workload.run(cluster, NODE_NAME)
        except (TimeoutError, OSError) as exc:
            print(f"kubegpu up: the demo workload failed: {exc}", file=sys.stderr)
            status = 1
    print(f"\nstop it with: kubegpu down{'' if args.state_dir is None else f' --state-dir {state_dir}'}")
    return status


def detach(cluster: object) -> None:
    """Let the cluster outlive this process (the control plane stops itself at exit otherwise)."""
    plane = getattr(cluster, "plane", None)
    if plane is not None:
        atexit.unregister(plane.stop)


def run_down(args: argparse.Namespace) -> int:
    from kubegpu.localcluster.cluster import LocalClusterError, teardown

    if os.geteuid() != 0:
        return _fail("down", "needs root")
    state_dir = (args.state_dir or default_state_dir()).absolute()
    try:
        left = teardown(state_dir)
    except LocalClusterError as exc:
        return _fail("down", str(exc))
    if left:
        print("kubegpu down: these were left behind:", file=sys.stderr)
        for item in left:
            print(f"  {item}", file=sys.stderr)
        return 1
    print(f"kubegpu down: stopped; nothing left (logs kept in {state_dir / 'logs'})")
    return 0
