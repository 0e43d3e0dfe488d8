"""Benchmark: the shim's CPU per CRI call beside the floor of its gRPC stack.

kubelet's steady state costs the shim CPU per forwarded call (docs/performance.md, "What the shim
costs a node"). This measures how much of that is the shim's own work: the same calls, at
kubelet's steady rate and mix, go through

- **shim:** ``kubegpu crishim`` with the sim device plugin (no API access: no advertiser, no pod
  lookups);
- **minimal forwarder:** ``bench/minimal_forwarder.py``, the same grpcio aio stack, event loop and
  gRPC settings forwarding opaque bytes and doing nothing else;
- **peer** (``--peer-binary``): koord-runtime-proxy, a Go CRI proxy, for reference;

in front of one private containerd with ``--containers`` running containers, in interleaved rounds
(each round gives every path ``--seconds`` of calls in turn). CPU is utime+stime of the proxy's
process from /proc over its window; the figure per path is the median over rounds of CPU per call,
and the percent of a core at ``--rate`` calls per second. The mix per 16 calls is kubelet's with
110 pods: 12 ContainerStatus, 2 ListContainers, 2 ListPodSandbox.

Usage: ``python bench/cri_cpu_floor.py [--json] [--rounds N] [--seconds S] [--rate R]
[--containers N] [--peer-binary PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node_overhead import koord_runtime_proxy, process_cpu_seconds, refuse_unusable_peer

from crishim.cri import api_pb2
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args

HERE = Path(__file__).resolve().parent
MIX = ("ContainerStatus",) * 12 + ("ListContainers",) * 2 + ("ListPodSandbox",) * 2


@dataclass
class Path_:
    """One proxy under test: its process and socket, and CPU ms per call of each round."""

    name: str
    process: subprocess.Popen[bytes]
    socket: Path
    per_call_ms: list[float] = field(default_factory=list)


def start_containers(client: CriClient, count: int) -> list[str]:
    """``count`` running busybox containers, each in its own host-network sandbox."""
    ids = []
    for n in range(count):
        config = host_network_sandbox(f"floor-{n}", str(uuid.uuid4()))
        sandbox = client.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config)).pod_sandbox_id
        created = client.runtime.CreateContainer(api_pb2.CreateContainerRequest(
            pod_sandbox_id=sandbox, config=shell_container("c", BUSYBOX_IMAGE, "sleep 1000000"),
            sandbox_config=config))
        client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=created.container_id))
        ids.append(created.container_id)
    return ids


def kubelet_mix(client: CriClient, containers: list[str]) -> list[Callable[[], Any]]:
    """One callable per call of the mix, ContainerStatus cycling over the containers."""
    runtime = client.runtime
    calls: list[Callable[[], Any]] = []
    for k, method in enumerate(MIX):
        if method == "ContainerStatus":
            request = api_pb2.ContainerStatusRequest(container_id=containers[k % len(containers)])
            calls.append(lambda r=request: runtime.ContainerStatus(r, timeout=10))
        elif method == "ListContainers":
            calls.append(lambda: runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=10))
        else:
            calls.append(lambda: runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=10))
    return calls


def drive(path: Path_, containers: list[str], seconds: float, rate: float) -> None:
    """Call through ``path`` at ``rate`` per second for ``seconds``; record its CPU ms per call."""
    client = CriClient(f"unix://{path.socket}")
    try:
        calls = kubelet_mix(client, containers)
        calls[0]()  # connected before the window opens
        cpu_before = process_cpu_seconds(path.process.pid)
        started = due = time.monotonic()
        made = 0
        while time.monotonic() - started < seconds:
            calls[made % len(calls)]()
            made += 1
            due += 1.0 / rate
            time.sleep(max(0.0, due - time.monotonic()))
        path.per_call_ms.append(1000 * (process_cpu_seconds(path.process.pid) - cpu_before) / made)
    finally:
        client.close()


def wait_for_socket(socket: Path, process: subprocess.Popen[bytes], what: str) -> None:
    """Until ``socket`` exists; exit naming ``what`` if its process dies or 30 s pass."""
    deadline = time.monotonic() + 30
    while not socket.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start (see its log under {socket.parent})")
        time.sleep(0.05)


def start_paths(
    containerd: Containerd, work: Path, peer_binary: str | None
) -> tuple[list[Path_], ShimProcess]:
    """The shim, the minimal forwarder and (given) the peer, each on its own socket under ``work``."""
    shim = ShimProcess(socket=work / "shim.sock", runtime_endpoint=containerd.endpoint,
                       log_path=work / "shim.log",
                       extra_args=sim_node_args("floor", "dgx1-v100", work / "sim")).start(timeout=60)
    assert shim.process is not None
    paths = [Path_("shim", shim.process, shim.socket)]
    with (work / "minimal.log").open("wb") as log:
        minimal = subprocess.Popen(
            [sys.executable, str(HERE / "minimal_forwarder.py"), str(work / "minimal.sock"),
             str(containerd.socket)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_socket(work / "minimal.sock", minimal, "the minimal forwarder")
    paths.append(Path_("minimal forwarder", minimal, work / "minimal.sock"))
    if peer_binary:
        with (work / "peer.log").open("wb") as log:
            peer = subprocess.Popen(koord_runtime_proxy(peer_binary)(work / "peer.sock", containerd.endpoint),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_socket(work / "peer.sock", peer, Path(peer_binary).name)
        paths.append(Path_(Path(peer_binary).name, peer, work / "peer.sock"))
    return paths, shim


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    with Containerd() as containerd:
        work = Path(tempfile.mkdtemp(prefix="kgfloor-", dir="/tmp"))
        direct = CriClient(containerd.endpoint)
        paths: list[Path_] = []
        shim: ShimProcess | None = None
        try:
            say(f"starting {args.containers} containers")
            containers = start_containers(direct, args.containers)
            paths, shim = start_paths(containerd, work, args.peer_binary)
            time.sleep(3)  # past the shim's startup work (ledger rebuild, first discovery)
            for round_ in range(args.rounds):
                order = paths[round_ % len(paths):] + paths[: round_ % len(paths)]
                for path in order:
                    drive(path, containers, args.seconds, args.rate)
                say(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
                    f"{p.name} {p.per_call_ms[-1]:.3f} ms" for p in paths))
        finally:
            for path in paths:
                if path.process.poll() is None and (shim is None or path.process is not shim.process):
                    path.process.kill()
                    path.process.wait(10)
            if shim is not None:
                shim.stop()
            direct.close()
            shutil.rmtree(work, ignore_errors=True)
        floor = statistics.median(paths[1].per_call_ms)
        return {
            "rate_per_second": args.rate,
            "seconds_per_round": args.seconds,
            "rounds": args.rounds,
            "containers": args.containers,
            "machine": {"cpus": os.cpu_count(), "load_average": list(os.getloadavg())},
            "paths": {
                p.name: {
                    "cpu_ms_per_call_p50": round(statistics.median(p.per_call_ms), 3),
                    "cpu_ms_per_call_rounds": [round(v, 3) for v in p.per_call_ms],
                    "percent_of_core_at_rate": round(statistics.median(p.per_call_ms) * args.rate / 10, 3),
                    # None when the floor's window showed no CPU tick (runs too short to measure)
                    "ratio_to_minimal_forwarder": (
                        round(statistics.median(p.per_call_ms) / floor, 3) if floor > 0 else None
                    ),
                }
                for p in paths
            },
        }


def table(result: dict[str, Any]) -> str:
    at = f"% of a core at {result['rate_per_second']}/s"
    lines = [f"{'path':<22} {'CPU ms/call p50':>16} {at:>22} {'/ minimal':>10}"]
    for name, row in result["paths"].items():
        ratio = row["ratio_to_minimal_forwarder"]
        lines.append(f"{name:<22} {row['cpu_ms_per_call_p50']:>16.3f} {row['percent_of_core_at_rate']:>22.3f}"
                     f" {'-' if ratio is None else f'{ratio:.3f}':>10}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per path per round")
    parser.add_argument("--rate", type=float, default=15.0, help="calls per second (kubelet, 110 pods: ~15)")
    parser.add_argument("--containers", type=int, default=20, help="running containers (default 20)")
    parser.add_argument("--peer-binary", help="koord-runtime-proxy binary to measure beside the shim")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.rate <= 0 or args.containers < 1:
        parser.error("--rounds, --seconds, --rate and --containers must be positive")
    refuse_unusable_peer(parser, args.peer_binary)
    say = (lambda _m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    result = run(args, say)
    if not args.json:
        print(table(result))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
