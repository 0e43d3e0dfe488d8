"""Benchmark: what the CRI shim adds over calling containerd directly.

The same calls go to containerd directly and through a ``kubegpu crishim`` process, interleaved
in one run (alternating rounds, so machine noise hits both paths alike), at concurrency 1 and 32:
Version, ContainerStatus, ListContainers over 100 containers, and ExecSync. Reported per call and
concurrency: p50/p99 latency of each path, calls/s of each path, the proxied/direct throughput
ratio and the shim's CPU time per call (from /proc/<pid>/stat over the proxied rounds).

Usage: ``python bench/proxy_overhead.py [--json] [--rounds N] [--calls N]``. Prints a table and
one JSON object (only the JSON object with ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc.aio

from crishim.cri import api_pb2, api_pb2_grpc
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LIST_CONTAINERS = 100


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class PathStats:
    """Latencies and wall time accumulated for one path (direct or proxied)."""

    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    calls: int = 0
    cpu: float = 0.0


@dataclass
class Workload:
    """One benchmarked call: a name, a request factory and the stub method to use."""

    name: str
    invoke: Callable[[api_pb2_grpc.RuntimeServiceStub], Awaitable[object]]
    calls: int


async def run_round(
    stub: api_pb2_grpc.RuntimeServiceStub, workload: Workload, concurrency: int, calls: int, stats: PathStats
) -> None:
    """Issue ``calls`` calls with ``concurrency`` callers; add latencies and wall time."""
    remaining = calls

    async def caller() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await workload.invoke(stub)
            stats.latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    stats.wall += time.perf_counter() - started
    stats.calls += calls


async def measure(
    direct_ep: str, shim: ShimProcess, workload: Workload, concurrency: int, rounds: int
) -> dict[str, object]:
    """Alternate direct and proxied rounds; return the result row for this call/concurrency."""
    channels = {
        name: grpc.aio.insecure_channel(ep.replace("unix://", "unix:", 1))
        for name, ep in (("direct", direct_ep), ("proxied", shim.endpoint))
    }
    stubs = {name: api_pb2_grpc.RuntimeServiceStub(ch) for name, ch in channels.items()}
    stats = {"direct": PathStats(), "proxied": PathStats()}
    per_round = max(1, workload.calls // rounds)
    assert shim.process is not None
    for name in stubs:  # warm up connections and caches
        await run_round(stubs[name], workload, concurrency, min(per_round, 2 * concurrency), PathStats())
    for _ in range(rounds):
        for name in ("direct", "proxied"):
            cpu_before = process_cpu_seconds(shim.process.pid)
            await run_round(stubs[name], workload, concurrency, per_round, stats[name])
            stats[name].cpu += process_cpu_seconds(shim.process.pid) - cpu_before
    for channel in channels.values():
        await channel.close()
    direct, proxied = stats["direct"], stats["proxied"]
    direct_rps = direct.calls / direct.wall
    proxied_rps = proxied.calls / proxied.wall
    return {
        "call": workload.name,
        "concurrency": concurrency,
        "direct_p50_ms": round(statistics.median(direct.latencies) * 1e3, 3),
        "proxied_p50_ms": round(statistics.median(proxied.latencies) * 1e3, 3),
        "direct_p99_ms": round(percentile(direct.latencies, 99) * 1e3, 3),
        "proxied_p99_ms": round(percentile(proxied.latencies, 99) * 1e3, 3),
        "added_p50_ms": round(
            (statistics.median(proxied.latencies) - statistics.median(direct.latencies)) * 1e3, 3
        ),
        "direct_rps": round(direct_rps, 1),
        "proxied_rps": round(proxied_rps, 1),
        "throughput_ratio": round(proxied_rps / direct_rps, 3),
        "proxy_cpu_ms_per_call": round(proxied.cpu / proxied.calls * 1e3, 3),
        # CPU the shim burns while the direct rounds run (idle cost), for reference.
        "proxy_idle_cpu_ms_per_direct_call": round(direct.cpu / direct.calls * 1e3, 3),
    }


def prepare_containers(client: CriClient, log_dir: Path) -> str:
    """One sandbox with a running container (returned) plus created ones up to LIST_CONTAINERS."""
    config = host_network_sandbox("bench", str(uuid.uuid4()), log_directory=str(log_dir))
    sandbox = client.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config)).pod_sandbox_id
    ids = []
    for index in range(LIST_CONTAINERS):
        container = shell_container(f"c{index}", BUSYBOX_IMAGE, "sleep 100000", log_path=f"c{index}.log")
        ids.append(
            client.runtime.CreateContainer(
                api_pb2.CreateContainerRequest(
                    pod_sandbox_id=sandbox, config=container, sandbox_config=config
                )
            ).container_id
        )
    client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=ids[0]))
    return ids[0]


def workloads(running: str, scale: float) -> list[Workload]:
    def n(count: int) -> int:
        return max(8, int(count * scale))

    return [
        Workload("Version", lambda s: s.Version(api_pb2.VersionRequest()), n(4000)),
        Workload(
            "ContainerStatus",
            lambda s: s.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=running)),
            n(3000),
        ),
        Workload(
            f"ListContainers({LIST_CONTAINERS})",
            lambda s: s.ListContainers(api_pb2.ListContainersRequest()),
            n(800),
        ),
        Workload(
            "ExecSync",
            lambda s: s.ExecSync(
                api_pb2.ExecSyncRequest(container_id=running, cmd=["true"], timeout=30), timeout=60
            ),
            n(96),
        ),
    ]


def print_table(rows: list[dict[str, object]]) -> None:
    header = (
        f"{'call':<22}{'conc':>5}{'direct p50':>12}{'proxy p50':>11}{'added':>8}"
        f"{'direct p99':>12}{'proxy p99':>11}{'direct/s':>10}{'proxy/s':>9}{'ratio':>7}"
        f"{'cpu ms/call':>13}"
    )
    print(header, file=sys.stderr)
    for r in rows:
        print(
            f"{r['call']:<22}{r['concurrency']:>5}{r['direct_p50_ms']:>12}{r['proxied_p50_ms']:>11}"
            f"{r['added_p50_ms']:>8}{r['direct_p99_ms']:>12}{r['proxied_p99_ms']:>11}"
            f"{r['direct_rps']:>10}{r['proxied_rps']:>9}{r['throughput_ratio']:>7}"
            f"{r['proxy_cpu_ms_per_call']:>13}",
            file=sys.stderr,
        )


async def run(args: argparse.Namespace) -> dict[str, object]:
    with Containerd() as containerd:
        shim = ShimProcess(
            containerd.base / "shim.sock", containerd.endpoint, containerd.base / "shim.log"
        ).start()
        try:
            client = CriClient(containerd.endpoint)
            running = prepare_containers(client, containerd.base / "logs")
            client.close()
            rows = []
            for workload in workloads(running, args.scale):
                if args.only and workload.name.split("(")[0] not in args.only:
                    continue
                for concurrency in (1, 32):
                    rows.append(await measure(containerd.endpoint, shim, workload, concurrency, args.rounds))
        finally:
            shim.stop()
    return {"results": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds per path")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply call counts")
    parser.add_argument("--only", nargs="*", help="only these calls (e.g. Version ExecSync)")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if not args.json:
        print_table(result["results"])  # type: ignore[arg-type]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
