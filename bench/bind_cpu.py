"""Micro-benchmark: CPU seconds of one extender bind, in this process, against a real apiserver.

Starts etcd + kube-apiserver (kubegpu.devenv.controlplane), advertises ``--nodes`` sim nodes of 8
GPUs, starts a live ``Scheduler`` watching them (as the extender runs it; no tend loop, so it
places nothing itself) and creates ``--pods`` one-GPU pods. Then calls ``Extender.bind`` for each
(the node with the most free GPUs first) and reports the process's CPU seconds (every thread: the
bind's request thread and the watch thread decoding the resulting pod updates) per bind, over
the binds and until the watch has seen every pod bound, and the binding thread's own CPU seconds
per bind. ``--profile FILE`` writes a cProfile of
the binding thread.

Usage::

    python bench/bind_cpu.py [--nodes N] [--pods N] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client as k8s

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubegpu.allocation import KeyRing  # noqa: E402
from kubegpu.devenv.controlplane import ControlPlane, ensure_namespace  # noqa: E402
from scheduler.live.config import SchedulerConfig  # noqa: E402
from scheduler.live.extender import Extender  # noqa: E402
from scheduler.live.extenderapi import BindArgs  # noqa: E402
from scheduler.live.scheduler import Scheduler  # noqa: E402
from tests.fixtures.keys import SIGNING  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402
from tests.test_scheduler_api import advertise, gpu_pod  # noqa: E402

PROFILE = "bench-bind"


def run(nodes: int, pods: int, profile: str | None) -> dict[str, float]:
    with ControlPlane() as cp, tempfile.TemporaryDirectory() as state:
        api = cp.admin_client()
        core = k8s.CoreV1Api(api)
        namespace = "bind-cpu"
        ensure_namespace(core, namespace)
        names = [f"n{i}" for i in range(nodes)]
        for name in names:
            advertise(core, name, "dgx1-v100", Path(state), labels={"run": "bind"})
        config = SchedulerConfig(scheduler_name=PROFILE, policy="topology", signing_key_id="k1")
        sched = Scheduler(config, api, KeyRing(None, SIGNING), seed=3)
        sched.start_watching()
        assert sched.wait_synced(30)
        sched.leading.set()
        extender = Extender(sched)
        uids = []
        for i in range(pods):
            body = gpu_pod(namespace, f"p{i}", 1, scheduler=PROFILE, selector={"run": "bind"})
            uids.append((f"p{i}", core.create_namespaced_pod(namespace, body).metadata.uid))

        def cached() -> int:
            with sched.cond:
                return sum(uid in sched.cache.pods for _, uid in uids)

        wait_for(lambda: cached() == pods, timeout=60.0, interval=0.02)
        time.sleep(0.5)
        free = {name: 8 for name in names}
        profiler = cProfile.Profile(time.thread_time) if profile else None
        thread_cpu = 0.0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for name, uid in uids:
            node = max(free, key=free.__getitem__)
            free[node] -= 1
            if profiler:
                profiler.enable()
            thread0 = time.thread_time()
            answer = extender.bind(BindArgs(name=name, namespace=namespace, uid=uid, node=node))
            thread_cpu += time.thread_time() - thread0
            if profiler:
                profiler.disable()
            assert answer == {"Error": ""}, answer
        cpu1, wall1 = time.process_time(), time.perf_counter()

        def seen_bound() -> int:
            with sched.cond:
                return sum(
                    bool(((sched.cache.pods.get(uid) or {}).get("spec") or {}).get("nodeName"))
                    for _, uid in uids
                )

        wait_for(lambda: seen_bound() == pods, timeout=60.0, interval=0.02)
        cpu2 = time.process_time()
        if profiler and profile:
            profiler.dump_stats(profile)
        sched.stop()
        return {
            "pods": pods,
            "bind_cpu_ms": round((cpu1 - cpu0) / pods * 1000, 3),
            "bind_thread_cpu_ms": round(thread_cpu / pods * 1000, 3),
            "bind_wall_ms": round((wall1 - wall0) / pods * 1000, 3),
            "bind_and_watch_cpu_ms": round((cpu2 - cpu0) / pods * 1000, 3),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    print(json.dumps(run(args.nodes, args.pods, args.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
