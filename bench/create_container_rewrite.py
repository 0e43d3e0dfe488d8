"""Benchmark: what the CreateContainer rewrite costs over plain passthrough.

Two measurements, one run:
- in process: the interception point alone (parse, verify signature, check, ledger, scrub, edits,
  serialise) with the sim plugin, against the passthrough interceptor (parse and serialise only),
  interleaved, ``--calls`` times each;
- end to end against a real containerd: CreateContainer directly, through a plain shim and through
  a rewriting shim (sim plugin, signed allocation), interleaved, ``--creates`` times each.

Prints a table and one JSON object (only the JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crishim.cri import api_pb2
from crishim.intercept import PassthroughInterceptor, intercept_create_container
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.registry import load_plugins
from devices.sim import sim_gpu_id
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, KeyRing, public_key_pem, sign
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess, sim_node_args

NODE, KEY_ID = "bench-node", "k1"
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))  # a fixed bench key


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples) * 1e3, 4),
        "p99_ms": round(percentile(samples, 99) * 1e3, 4),
    }


def allocated_request(
    uid: str, sandbox_id: str, name: str, log_dir: str, gpus: list[str]
) -> api_pb2.CreateContainerRequest:
    annotation = sign(Allocation(NODE, uid, {"app": ContainerAllocation(tuple(gpus))}), KEY_ID, KEY)
    config = host_network_sandbox(name, uid, log_directory=log_dir, annotations={ANNOTATION: annotation})
    container = shell_container(
        "app", BUSYBOX_IMAGE, "sleep 1", log_path="app.log", envs={"A": "1", "B": "2"}
    )
    return api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=container, sandbox_config=config)


def in_process(calls: int, state_dir: Path) -> dict[str, object]:
    plugins = load_plugins(["sim"], {"node_name": NODE, "topology": "dgx1-v100", "state_dir": str(state_dir)})
    node_devices = NodeDevices(plugins, sysfs_root=None)
    node_devices.discover()
    rewriter = AllocationRewriter(NODE, node_devices, KeyRing(None, {KEY_ID: KEY}))
    rewriter.rebuilt.set()
    raw = allocated_request(
        str(uuid.uuid4()), "sb", "pod", "/tmp", [sim_gpu_id(NODE, 0), sim_gpu_id(NODE, 3)]
    )
    # the uid in the annotation must match the sandbox's: build it once, consistently
    raw_bytes = raw.SerializeToString()
    passthrough = PassthroughInterceptor()
    times: dict[str, list[float]] = {"passthrough": [], "rewrite": []}

    async def run() -> None:
        for _ in range(calls):
            for name, interceptor in (("passthrough", passthrough), ("rewrite", rewriter)):
                started = time.perf_counter()
                _, completion = await intercept_create_container(raw_bytes, interceptor)
                times[name].append(time.perf_counter() - started)
                if completion is not None:
                    completion(None, False)

    asyncio.run(run())
    added = [r - p for r, p in zip(times["rewrite"], times["passthrough"], strict=True)]
    return {
        "calls": calls,
        "passthrough": summary(times["passthrough"]),
        "rewrite": summary(times["rewrite"]),
        "added_p50_ms": round(statistics.median(added) * 1e3, 4),
        "added_p99_ms": round(percentile(added, 99) * 1e3, 4),
    }


def end_to_end(creates: int) -> dict[str, object]:
    with Containerd() as containerd, tempfile.TemporaryDirectory(prefix="kgbench-") as tmp:
        keys = Path(tmp) / "keys"
        keys.mkdir()
        (keys / KEY_ID).write_bytes(public_key_pem(KEY))
        plain = ShimProcess(Path(tmp) / "plain.sock", containerd.endpoint, Path(tmp) / "plain.log").start()
        rewriting = ShimProcess(
            Path(tmp) / "rw.sock",
            containerd.endpoint,
            Path(tmp) / "rw.log",
            extra_args=sim_node_args(NODE, "dgx1-v100", str(Path(tmp) / "sim"), str(keys)),
        ).start()
        clients = {
            "direct": CriClient(containerd.endpoint),
            "shim": CriClient(plain.endpoint),
            "rewrite": CriClient(rewriting.endpoint),
        }
        try:
            uid = str(uuid.uuid4())
            probe = allocated_request(uid, "", "bench", tmp, [sim_gpu_id(NODE, 1)])
            sandbox = (
                clients["direct"]
                .runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=probe.sandbox_config))
                .pod_sandbox_id
            )
            times: dict[str, list[float]] = {name: [] for name in clients}
            for attempt in range(creates):
                for name, client in clients.items():
                    request = allocated_request(uid, sandbox, "bench", tmp, [sim_gpu_id(NODE, 1)])
                    request.config.metadata.name = f"c-{name}"
                    request.config.metadata.attempt = attempt
                    started = time.perf_counter()
                    created = client.runtime.CreateContainer(request, timeout=60).container_id
                    times[name].append(time.perf_counter() - started)
                    client.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=created))
        finally:
            for client in clients.values():
                client.close()
            plain.stop()
            rewriting.stop()
    result: dict[str, object] = {"creates": creates}
    for name, samples in times.items():
        result[name] = summary(samples)
    result["rewrite_added_p50_ms_vs_shim"] = round(
        (statistics.median(times["rewrite"]) - statistics.median(times["shim"])) * 1e3, 3
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--creates", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kgbench-sim-") as state:
        local = in_process(args.calls, Path(state))
    e2e = end_to_end(args.creates)
    result = {"create_container": {"in_process": local, "end_to_end": e2e}}
    if not args.json:
        print(
            f"in process ({local['calls']} calls): passthrough p50 {local['passthrough']['p50_ms']} ms "
            f"p99 {local['passthrough']['p99_ms']} ms | rewrite p50 {local['rewrite']['p50_ms']} ms "
            f"p99 {local['rewrite']['p99_ms']} ms | added p50 {local['added_p50_ms']} ms "
            f"p99 {local['added_p99_ms']} ms",
            file=sys.stderr,
        )
        print(
            f"end to end ({e2e['creates']} creates each): "
            + " | ".join(
                f"{name} p50 {e2e[name]['p50_ms']} ms p99 {e2e[name]['p99_ms']} ms"  # type: ignore[index]
                for name in ("direct", "shim", "rewrite")
            ),
            file=sys.stderr,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
