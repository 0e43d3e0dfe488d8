"""HAMi's scheduler extender as a fourth kind of bench/extender_throughput.py (issue 23), and the
stand-in for the part of HAMi's NVIDIA device plugin that its scheduler waits on.

HAMi (github.com/Project-HAMi/HAMi) binds a pod only after taking a per-node lock, the Node
annotation ``hami.io/mutex.lock`` (``pkg/util/nodelock``: ``LockNode`` / ``SetNodeLock``). Only its
device plugin releases that lock, in kubelet's ``Allocate`` call for the pod
(``pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go``, ``Allocate``, and ``util.go``):

1. ``GetPendingPod``: GET the Node, read the lock's ``<time>,<namespace>,<name>``, GET that pod;
2. ``patchErasedAnnotation``: merge-patch the pod's ``hami.io/vgpu-devices-to-allocate`` with the
   first container's devices erased (``popNextContainerDevices``);
3. ``PodAllocationTrySuccess``: GET the pod again; when its devices-to-allocate names no device
   type left to handle (``NVIDIA``), ``PodAllocationSuccess``: merge-patch the pod's
   ``hami.io/bind-phase`` to ``success``, then ``nodelock.ReleaseNodeLock``: GET the Node, check
   the lock is this pod's, GET the Node again (its retry loop) and merge-patch the lock annotation
   to null with the Node's resourceVersion as precondition (retried on any error, 5 steps from
   100 ms, factor 2).

There is no kubelet nor device plugin on the bench's Node objects, so ``main`` here (a process of
its own, its CPU counted in the HAMi kind) watches the HAMi kind's namespace and, for each pod it
sees bound with ``hami.io/bind-phase: allocating`` (what kubelet's admission would hand the plugin),
makes exactly those API calls, one pod at a time per node (the plugin's ``applyMutex``). Everything
kubelet itself does before ``Allocate`` (admission, the device manager's gRPC call) is left out, so
the stand-in is faster than a real node: its latency is a lower bound on what every HAMi bind
waits for on the same node.

The pure parts (the device config, kube-scheduler's extender stanza, the Nodes' register
annotation, the lock's parsing and the stand-in's patch bodies) are tested in
tests/test_bench_extender.py without HAMi's binary.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SCHEDULER_NAME = "bench-hami"
NAMESPACE = "bench-ext-hami"
REGISTER_ANNOTATION = "hami.io/node-nvidia-register"  # pkg/device/nvidia/device.go RegisterAnnos
HANDSHAKE_ANNOTATION = "hami.io/node-handshake"  # HandshakeAnnos: HAMi's scheduler writes it
LOCK_ANNOTATION = "hami.io/mutex.lock"  # pkg/util/nodelock NodeLockKey
LOCK_SEP = ","  # NodeLockSep
BIND_PHASE = "hami.io/bind-phase"  # pkg/util DeviceBindPhase
BIND_TIME = "hami.io/bind-time"  # BindTimeAnnotations
ALLOCATING, SUCCESS = "allocating", "success"  # DeviceBindAllocating, DeviceBindSuccess
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"  # InRequestDevices["NVIDIA"]
DEVICES_TO_HANDLE = ("NVIDIA",)  # device.DevicesToHandle with only the nvidia config
CONTAINER_SEP = ";"  # OnePodMultiContainerSplitSymbol
# The chart's (charts/hami/templates/_helpers.tpl) managed resources for NVIDIA, every one
# ignoredByScheduler; the chart also lists other vendors' resources, which no bench pod asks for.
MANAGED_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/priority",
)
DEVICE_SPLIT_COUNT = 10  # values.yaml devicePlugin.deviceSplitCount: the plugin registers this count
# HAMi's retry.OnError strategy for the lock (nodelock.DefaultStrategy).
RETRY_STEPS, RETRY_FIRST_S, RETRY_FACTOR, RETRY_JITTER = 5, 0.1, 2.0, 0.5


# --------------------------------------------------------------------------- pure parts


def device_config() -> dict[str, Any]:
    """``--device-config-file``: the chart's ``nvidia:`` section (templates/scheduler/
    device-configmap.yaml) with values.yaml's defaults filled in (no MIG allowlist: no MIG here)."""
    return {
        "nvidia": {
            "resourceCountName": "nvidia.com/gpu",
            "resourceMemoryName": "nvidia.com/gpumem",
            "resourceMemoryPercentageName": "nvidia.com/gpumem-percentage",
            "resourceCoreName": "nvidia.com/gpucores",
            "resourcePriorityName": "nvidia.com/priority",
            "overwriteEnv": False,
            "defaultMemory": 0,
            "defaultCores": 0,
            "defaultGPUNum": 1,
            "preConfiguredDeviceMemory": 0,
            "memoryFactor": 1,
            "deviceSplitCount": DEVICE_SPLIT_COUNT,
            "deviceMemoryScaling": 1,
            "deviceCoreScaling": 1,
            "enableNumaTopology": False,
            "gpuCorePolicy": "default",
            "libCudaLogLevel": 1,
            "runtimeClassName": "",
        }
    }


def scheduler_config(port: int, qps: int) -> dict[str, Any]:
    """kube-scheduler's config for the HAMi kind: the chart's extender stanza (templates/scheduler/
    configmap.yaml, no admission webhook: plain HTTP) pointed at ``http://127.0.0.1:PORT``, one
    profile ``bench-hami``, the bench's client qps and burst."""
    return {
        "clientConnection": {"qps": qps, "burst": qps},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
        "extenders": [
            {
                "urlPrefix": f"http://127.0.0.1:{port}",
                "enableHTTPS": False,
                "filterVerb": "filter",
                "bindVerb": "bind",
                "nodeCacheCapable": True,
                "weight": 1,
                "httpTimeout": "30s",
                "managedResources": [{"name": r, "ignoredByScheduler": True} for r in MANAGED_RESOURCES],
            }
        ],
    }


def scheduler_args(
    binary: Path, port: int, metrics_port: int, config_file: Path, qps: int, node_policy: str = "binpack"
) -> list[str]:
    """HAMi's scheduler command line as the chart's deployment has it (templates/scheduler/
    deployment.yaml, no TLS, the chart's default policies: nodes ``binpack`` unless ``node_policy``
    says otherwise, GPUs ``spread``), on loopback ports, with the bench's client qps and burst
    (HAMi's default is client-go's 5 and 10) and no leader election."""
    return [
        str(binary),
        f"--http_bind=127.0.0.1:{port}",
        f"--scheduler-name={SCHEDULER_NAME}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        f"--node-scheduler-policy={node_policy}",
        "--gpu-scheduler-policy=spread",
        "--force-overwrite-default-scheduler=true",
        f"--device-config-file={config_file}",
        "--leader-elect=false",
        f"--kube-qps={qps}",
        f"--kube-burst={qps}",
    ]


def register_annotation(
    node: str, gpus: int = 8, model: str = "NVIDIA H100 80GB HBM3", memory_mib: int = 81559
) -> str:
    """``hami.io/node-nvidia-register`` as HAMi's device plugin writes it (``RegisterInAnnotation``:
    ``device.MarshalNodeDevices`` of ``getAPIDevices``): a JSON list, one entry per GPU with its
    UUID, index, split count, memory (MiB), cores (100), model, NUMA node, mode and health; Go's
    ``omitempty`` drops the zero index and NUMA node."""
    devices = []
    for i in range(gpus):
        entry: dict[str, Any] = {"id": f"GPU-{node}-{i}"}
        if i:
            entry["index"] = i
        entry.update(count=DEVICE_SPLIT_COUNT, devmem=memory_mib, devcore=100, type=model)
        if i >= gpus // 2:
            entry["numa"] = 1
        entry.update(mode="hami-core", health=True)
        devices.append(entry)
    return json.dumps(devices, separators=(",", ":"))


def node_annotations(node: str) -> dict[str, str]:
    """What HAMi's device plugin leaves on a Node before any pod: its register annotation. (The
    handshake annotation is HAMi's scheduler's to write, ``Requesting_<time>``, and it does.)"""
    return {REGISTER_ANNOTATION: register_annotation(node)}


def parse_lock(value: str) -> tuple[str, str] | None:
    """(namespace, pod) of a ``<RFC3339 time>,<namespace>,<name>`` lock, None for the legacy form
    (a bare timestamp) or a malformed one (``nodelock.ParseNodeLock``)."""
    parts = value.split(LOCK_SEP)
    if len(parts) != 3 or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def lock_is_owned_by(value: str, namespace: str, name: str) -> bool:
    """``ReleaseNodeLock``'s owner check: a legacy lock (no separator) is anyone's; else it must
    end with ``,<namespace>,<name>``."""
    return LOCK_SEP not in value or value.endswith(f"{LOCK_SEP}{namespace}{LOCK_SEP}{name}")


def erased_devices(value: str) -> str:
    """The devices-to-allocate annotation after one ``Allocate`` call: the first container entry
    that names a device emptied, every entry re-terminated by ``;`` (``DecodePodDevices`` keeps
    empty entries, ``EncodePodSingleDevice`` ends each with ``;``)."""
    entries = value.split(CONTAINER_SEP)
    for i, entry in enumerate(entries):
        if "," in entry:  # DecodeContainerDevices: a device is "uuid,type,mem,cores"
            entries[i] = ""
            break
    return "".join(e + CONTAINER_SEP for e in entries)


def all_allocated(value: str) -> bool:
    """``podAllocationTrySuccess``: no device type HAMi handles is left in devices-to-allocate."""
    return not any(word in value for word in DEVICES_TO_HANDLE)


def pod_annotation_patch(annotations: Mapping[str, str]) -> bytes:
    """``util.PatchPodAnnotations``' merge-patch body (Go's json.Marshal: sorted keys, compact)."""
    return json.dumps(
        {"metadata": {"annotations": dict(sorted(annotations.items()))}}, separators=(",", ":")
    ).encode()


def lock_release_patch(resource_version: str) -> bytes:
    """``ReleaseNodeLock``'s merge-patch body: the lock annotation to null, the Node's
    resourceVersion as precondition."""
    return (
        f'{{"metadata":{{"annotations":{{"{LOCK_ANNOTATION}":null}},"resourceVersion":"{resource_version}"}}}}'
    ).encode()


def wants_allocate(pod: Mapping[str, Any]) -> bool:
    """A pod kubelet would now admit and hand to the device plugin: bound, in bind phase
    ``allocating``."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return bool((pod.get("spec") or {}).get("nodeName")) and annotations.get(BIND_PHASE) == ALLOCATING


def latency_summary(counts: Mapping[str, int], seconds: Sequence[float]) -> dict[str, Any]:
    """The stand-in's report line: its counts and, over the pods it released, the time from the
    watch event showing the pod bound to the lock's release (ms: mean, median, p99, max)."""
    ordered = sorted(seconds)
    out: dict[str, Any] = dict(counts)
    if ordered:
        out.update(
            mean_ms=round(1000 * sum(ordered) / len(ordered), 1),
            p50_ms=round(1000 * ordered[len(ordered) // 2], 1),
            p99_ms=round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
            max_ms=round(1000 * ordered[-1], 1),
        )
    return out


def retry_delays(rng: random.Random) -> list[float]:
    """The sleeps between ``retry.OnError``'s tries (wait.Backoff: duration x factor^i, plus up to
    jitter x duration)."""
    delays, duration = [], RETRY_FIRST_S
    for _ in range(RETRY_STEPS - 1):
        delays.append(duration + rng.random() * RETRY_JITTER * duration)
        duration *= RETRY_FACTOR
    return delays


# --------------------------------------------------------------------------- the stand-in process


class StandIn:
    """The device plugin's Allocate-time API calls for each pod of ``namespace`` seen bound in
    phase ``allocating``, one pod at a time per node, ``workers`` nodes at once."""

    def __init__(self, kubeconfig: Path, namespace: str, workers: int) -> None:
        from kubernetes import client as k8s
        from kubernetes.config import load_kube_config

        configuration = k8s.Configuration()
        load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = workers + 4
        self.api = k8s.ApiClient(configuration)
        self.core = k8s.CoreV1Api(self.api)
        self.namespace = namespace
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.node_locks: dict[str, threading.Lock] = {}
        self.seen: set[str] = set()
        self.rng = random.Random(0)
        self.counts = {"allocated": 0, "released": 0, "errors": 0}
        self.release_seconds: list[float] = []  # event seen -> lock released, per pod
        self.guard = threading.Lock()

    # ---- API calls, raw JSON (the generated models cost more CPU than the calls)

    def _call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        """One request (a merge-patch when ``body`` is given); its body, or RuntimeError on a
        status other than 2xx."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        method, url, headers, data, _ = self.api.param_serialize(
            method,
            path,
            header_params=headers,
            body=json.loads(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=data)
        payload = response.read()
        if not 200 <= response.status < 300:
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:200]!r}")
        return bytes(payload)

    def _get(self, path: str) -> dict[str, Any]:
        return dict(json.loads(self._call("GET", path)))

    def _patch(self, path: str, body: bytes) -> None:
        self._call("PATCH", path, body)

    def _pod_path(self, namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{name}"

    # ---- one Allocate

    def allocate(self, node: str, seen: float) -> None:
        """What ``Allocate`` does against the API for the pod the node's lock names (``seen``:
        when the watch showed the pod bound, ``time.monotonic``)."""
        with self.guard:
            lock = self.node_locks.setdefault(node, threading.Lock())
        with lock:  # the plugin's applyMutex
            try:
                if self._allocate(node):
                    with self.guard:
                        self.release_seconds.append(time.monotonic() - seen)
            except Exception as error:  # counted; the run's JSON reports it
                with self.guard:
                    self.counts["errors"] += 1
                print(f"stand-in: {node}: {type(error).__name__}: {str(error)[:200]}", file=sys.stderr)

    def _allocate(self, node: str) -> bool:
        """True when it released the node's lock."""
        node_path = f"/api/v1/nodes/{node}"
        value = ((self._get(node_path).get("metadata") or {}).get("annotations") or {}).get(LOCK_ANNOTATION)
        owner = parse_lock(value) if value else None
        if owner is None:
            return False  # GetAllocatePodByNode finds no pod: the plugin would list the node's pods
        namespace, name = owner
        pod = self._get(self._pod_path(namespace, name))
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        self._patch(
            self._pod_path(namespace, name),
            pod_annotation_patch({TO_ALLOCATE: erased_devices(annotations.get(TO_ALLOCATE, ""))}),
        )
        refreshed = self._get(self._pod_path(namespace, name))
        if not all_allocated(
            ((refreshed.get("metadata") or {}).get("annotations") or {}).get(TO_ALLOCATE, "")
        ):
            return False
        self._patch(self._pod_path(namespace, name), pod_annotation_patch({BIND_PHASE: SUCCESS}))
        with self.guard:
            self.counts["allocated"] += 1
        return self._release(node_path, namespace, name)

    def _release(self, node_path: str, namespace: str, name: str) -> bool:
        """``nodelock.ReleaseNodeLock(node, lock, pod, false)``; True when it removed the lock."""
        first = ((self._get(node_path).get("metadata") or {}).get("annotations") or {}).get(LOCK_ANNOTATION)
        if first is None or not lock_is_owned_by(first, namespace, name):
            return False
        delays = retry_delays(self.rng)
        for attempt in range(RETRY_STEPS):
            try:
                meta = self._get(node_path).get("metadata") or {}
                current = (meta.get("annotations") or {}).get(LOCK_ANNOTATION)
                if current is None or not lock_is_owned_by(current, namespace, name):
                    return False
                self._patch(node_path, lock_release_patch(str(meta.get("resourceVersion", ""))))
                with self.guard:
                    self.counts["released"] += 1
                return True
            except Exception:
                if attempt == RETRY_STEPS - 1:
                    raise
                time.sleep(delays[attempt])
        return False

    def report(self, interval: float = 1.0) -> None:
        """Print ``latency_summary`` as one JSON line whenever it changed (the bench reads the last)."""
        last = ""
        while True:
            time.sleep(interval)
            with self.guard:
                line = json.dumps(latency_summary(self.counts, self.release_seconds))
            if line != last:
                print(line, flush=True)
                last = line

    # ---- the watch

    def run(self) -> None:
        """Watch the namespace forever (relisting when the watch ends); hand each pod that wants
        its Allocate to the pool, once per pod UID."""
        from scheduler.live.reflector import parse_events, response_lines

        threading.Thread(target=self.report, name="report", daemon=True).start()
        while True:
            listing = json.loads(self.core.list_namespaced_pod(self.namespace, _preload_content=False).data)
            for item in listing.get("items") or []:
                self._consider(item)
            stream = self.core.list_namespaced_pod(
                self.namespace,
                watch=True,
                resource_version=listing["metadata"]["resourceVersion"],
                timeout_seconds=3600,
                allow_watch_bookmarks=False,
                _preload_content=False,
            )
            try:
                for kind, obj in parse_events(response_lines(stream)):
                    if kind in ("ADDED", "MODIFIED"):
                        self._consider(obj)
            except Exception as error:
                print(f"stand-in: watch: {type(error).__name__}: {str(error)[:200]}", file=sys.stderr)
            finally:
                stream.close()

    def _consider(self, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if not wants_allocate(pod) or uid in self.seen:
            return
        self.seen.add(uid)
        self.pool.submit(self.allocate, str(pod["spec"]["nodeName"]), time.monotonic())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stand-in for HAMi's device plugin's Allocate")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", default=NAMESPACE)
    parser.add_argument("--workers", type=int, default=32, help="nodes served at once")
    args = parser.parse_args(argv)
    StandIn(args.kubeconfig, args.namespace, args.workers).run()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scheduler.live.reflector
    sys.exit(main())
