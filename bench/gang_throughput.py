"""Benchmark: gang scheduling throughput against a real apiserver (issue 21).

One control plane (etcd + kube-apiserver v1.37.2 serving both PodGroup APIs: scheduler-plugins'
CRD from deploy/crds/ and Kubernetes' own ``scheduling.k8s.io/v1beta1`` with the
``GenericWorkload`` gate) and one node set (by default 500 Nodes of 8 GPUs, advertised as the
kubegpu advertiser leaves them; bench/scheduler_throughput.py's machinery). Three kinds of round,
each placing the same pods (by default 200 groups of 8 one-GPU pods, 1,600 pods), interleaved
(ABC CBA ABC ...) so that machine noise hits every kind:

- ``kubegpu-gang``: the live kubegpu ``Scheduler`` (in this process); every group a PodGroup with
  a minimum of all its members (Kubernetes' ``spec.schedulingPolicy.gang.minCount``, pods naming it
  in ``spec.schedulingGroup.podGroupName``; ``--group-api plugins``: scheduler-plugins'
  ``spec.minMember``, pods labelled ``scheduling.x-k8s.io/pod-group``);
- ``kubegpu-plain``: the same pods with no group;
- ``kube-scheduler-gang``: kube-scheduler v1.37.2 (a process; ``--feature-gates=GenericWorkload=true``
  turns on its GangScheduling plugin in the default profile) with the same Kubernetes PodGroups;
  the pods ask ``nvidia.com/gpu``, which it counts as an extended resource.

The PodGroups of a round are created (and, for kubegpu, seen by its cache) before its pods; the pods
are then created together, a group's members one after another (``--arrival interleaved``: member
0 of every group, then member 1, ...), by a separate process that also watches the binds. A
round's rate is bound pods / (last pod seen bound - first pod creation); groups/s counts the groups
bound whole over the same time. Headline figures are medians over the rounds of a kind. Between
rounds pods, PodGroups and Events are deleted, so every round starts on empty nodes.
``--backlog`` adds rounds whose pods all exist before the scheduler may start (timed first to last
bind), as in bench/scheduler_throughput.py. Diagnostics, not part of the default numbers:
``--profile`` (cProfile of kubegpu's scheduling thread in its rounds), ``--what-if-quiet`` (kubegpu
posts no Events).

Whole groups (``account_groups``). Every member is bound by its own Binding, so a watcher always
sees a group pass through 1..7 bound members for a moment, under both schedulers. The benchmark
reports:

- ``partial_groups_seen``: groups that, once the round's binds had settled (every pod bound, or no
  new bind for ``--stall-seconds``), had some but fewer than their minimum members bound, by the
  watch's account or by a list of the pods taken then (a group bound in part and left so: what gang
  scheduling forbids);
- ``max_partial_groups_at_once``: the most groups the watch saw bound in part at one moment (each
  bind event is one moment), and ``max_group_bind_spread_seconds``: the longest time from a group's
  first member seen bound to its last. Both are transient by construction and shown for scale.

Usage::

    python bench/gang_throughput.py [--json] [--quick] [--nodes N] [--groups N] [--group-size N]
                                    [--rounds N] [--group-api kube|plugins]
                                    [--arrival grouped|interleaved] [--backlog] [--profile]
                                    [--what-if-quiet] [--stall-seconds S]

``--quick`` is ``--nodes 50 --groups 20``. Prints a table, then one JSON object (only the JSON
object with ``--json``): ``gang_pods_per_second``, ``plain_pods_per_second``, ``ratio`` (gang /
plain, target at least 0.8), ``groups``, ``groups_placed_whole``, ``partial_groups_seen`` (target
0), ``kube_scheduler_gang_pods_per_second``, ``ratio_vs_kube_scheduler_gang`` (target above 1.0),
with groups/s, the transient measures, the per-round detail and CPU seconds per process.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/scheduler_throughput.py

import scheduler_throughput as st  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from kubegpu.devenv.controlplane import POD_GROUP_API_ARGS, ControlPlane  # noqa: E402
from kubegpu.devenv.manifests import apply_manifests  # noqa: E402
from scheduler.live.podgroups import (  # noqa: E402
    KUBE_API,
    KUBE_VERSION,
    PLUGINS_API,
    PLUGINS_LABEL,
    PLUGINS_VERSION,
    PLURAL,
)

CRDS = Path(__file__).resolve().parents[1] / "deploy" / "crds"
GANG, PLAIN, KUBE_GANG = "kubegpu-gang", "kubegpu-plain", "kube-scheduler-gang"
KINDS = (GANG, PLAIN, KUBE_GANG)
NAMESPACES = {
    GANG: "bench-gang-kubegpu",
    PLAIN: "bench-plain-kubegpu",
    KUBE_GANG: "bench-gang-kube-scheduler",
}
KUBE_ARGS = ("--feature-gates=GenericWorkload=true",)
TARGET_RATIO = 0.8
QUICK = {"nodes": 50, "groups": 20}
FULL = {"nodes": 500, "groups": 200}


# --------------------------------------------------------------------------- pure parts


def group_name(prefix: str, index: int) -> str:
    return f"{prefix}-g{index:04d}"


def member_name(group: str, index: int) -> str:
    return f"{group}-m{index:02d}"


def arrival_order(groups: int, size: int, interleaved: bool) -> list[tuple[int, int]]:
    """(group, member) in creation order: a group's members together, or member 0 of every group
    first, then member 1, ... (``interleaved``)."""
    if interleaved:
        return [(g, m) for m in range(size) for g in range(groups)]
    return [(g, m) for g in range(groups) for m in range(size)]


def member_pod(
    namespace: str, name: str, scheduler: str, group: str | None, api: str | None
) -> dict[str, Any]:
    """A one-GPU pod (bench/scheduler_throughput.py's) that joins ``group`` of ``api`` (None: no group)."""
    pod = st.pod_json(namespace, name, scheduler, gpus=1)
    if group is None:
        return pod
    if api == PLUGINS_API:
        pod["metadata"]["labels"] = {PLUGINS_LABEL: group}
    elif api == KUBE_API:
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    else:
        raise ValueError(f"unknown pod group API {api!r}")
    return pod


def pod_group(api: str, name: str, min_member: int) -> dict[str, Any]:
    """A PodGroup of ``api`` asking ``min_member`` pods together."""
    if api == PLUGINS_API:
        return {
            "apiVersion": f"{PLUGINS_API}/{PLUGINS_VERSION}",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"minMember": min_member},
        }
    if api == KUBE_API:
        return {
            "apiVersion": f"{KUBE_API}/{KUBE_VERSION}",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_member}}},
        }
    raise ValueError(f"unknown pod group API {api!r}")


def size_problem(nodes: int, groups: int, size: int, gpus_per_node: int = 8) -> str | None:
    """Why the sizes make no throughput benchmark (None: they do): every pod must fit at once."""
    if nodes < 1 or groups < 1 or size < 1:
        return "--nodes, --groups and --group-size must be at least 1"
    if groups * size > nodes * gpus_per_node:
        return (
            f"{groups} groups of {size} one-GPU pods need {groups * size} GPUs; "
            f"{nodes} nodes have {nodes * gpus_per_node}"
        )
    return None


@dataclass(frozen=True)
class GroupAccount:
    """How a round's groups ended and what the watch saw on the way (see the module docstring)."""

    groups: int
    whole: int  # at least the minimum bound at the end (list and watch agree)
    partial: int  # some but fewer than the minimum bound at the end, by the list or the watch
    unbound: int  # none bound at the end
    max_partial_at_once: int  # the most groups bound in part at one moment of the watch
    max_spread_seconds: float | None  # first to last member seen bound, over the whole groups
    median_spread_seconds: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "groups_placed_whole": self.whole,
            "partial_groups_seen": self.partial,
            "groups_unbound": self.unbound,
            "max_partial_groups_at_once": self.max_partial_at_once,
            "max_group_bind_spread_seconds": self.max_spread_seconds,
            "median_group_bind_spread_seconds": self.median_spread_seconds,
        }


def account_groups(
    binds: Iterable[tuple[str, float]],
    group_of: Mapping[str, str],
    min_member: int,
    listed_bound: Mapping[str, int],
) -> GroupAccount:
    """Account a round's groups from the binds in the order the watch saw them (pod name, stamp)
    and the members bound per group in a list taken after the binds settled.

    A group is whole when both accounts have at least ``min_member`` bound; partial when either
    has some but fewer; unbound when neither has any. Pods that are no group's are ignored.
    """
    groups = sorted(set(group_of.values()))
    seen: Counter[str] = Counter()
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    partial_now: set[str] = set()
    most = 0
    for name, stamp in binds:
        group = group_of.get(name)
        if group is None:
            continue
        seen[group] += 1
        first.setdefault(group, stamp)
        last[group] = stamp
        if seen[group] < min_member:
            partial_now.add(group)
        else:
            partial_now.discard(group)
        most = max(most, len(partial_now))
    whole = partial = unbound = 0
    spreads: list[float] = []
    for group in groups:
        counts = (seen[group], listed_bound.get(group, 0))
        if all(c >= min_member for c in counts):
            whole += 1
            spreads.append(last[group] - first[group])
        elif any(counts):  # some bound, by either account, and short of the minimum by one
            partial += 1
        else:
            unbound += 1
    return GroupAccount(
        len(groups),
        whole,
        partial,
        unbound,
        most,
        round(max(spreads), 3) if spreads else None,
        round(statistics.median(spreads), 3) if spreads else None,
    )


def bound_per_group(pods: Iterable[Mapping[str, Any]], group_of: Mapping[str, str]) -> Counter[str]:
    """Members bound to a node per group, from listed pods."""
    counts: Counter[str] = Counter()
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "")
        if name in group_of and (pod.get("spec") or {}).get("nodeName"):
            counts[group_of[name]] += 1
    return counts


def median_or_none(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if ours and theirs else None


def kind_summary(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians (and ranges) over a kind's rounds, the group accounts summed."""
    pods_rates = [r["pods_per_second"] for r in rounds]
    group_rates = [r["groups_per_second"] for r in rounds if r["groups_per_second"] is not None]
    out: dict[str, Any] = {
        "rounds": len(rounds),
        "pods_per_second": median_or_none(pods_rates),
        "pods_per_second_range": [min(pods_rates), max(pods_rates)] if pods_rates else None,
        "groups_per_second": median_or_none(group_rates),
        "pods": sum(r["pods"] for r in rounds),
        "bound": sum(r["bound"] for r in rounds),
    }
    accounts = [r["groups"] for r in rounds if r["groups"] is not None]
    if accounts:
        out["groups"] = sum(a["groups"] for a in accounts)
        out["groups_placed_whole"] = sum(a["groups_placed_whole"] for a in accounts)
        out["partial_groups_seen"] = sum(a["partial_groups_seen"] for a in accounts)
        out["max_partial_groups_at_once"] = max(a["max_partial_groups_at_once"] for a in accounts)
        spreads = [a["max_group_bind_spread_seconds"] for a in accounts if a["max_group_bind_spread_seconds"]]
        out["max_group_bind_spread_seconds"] = max(spreads) if spreads else None
    cpu: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for r in rounds:
        cpu.update(r["cpu_seconds"])
        threads.update(r["kubegpu_threads_cpu_seconds"])
    out["cpu_seconds"] = {k: round(v, 2) for k, v in cpu.items()}
    out["kubegpu_threads_cpu_seconds"] = {k: round(v, 2) for k, v in threads.items()}
    out["per_round"] = list(rounds)
    return out


def headline(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The issue's figures from the three kinds' summaries."""
    gang, plain, kube = summaries[GANG], summaries[PLAIN], summaries[KUBE_GANG]
    out = {
        "gang_pods_per_second": gang["pods_per_second"],
        "plain_pods_per_second": plain["pods_per_second"],
        "ratio": ratio(gang["pods_per_second"], plain["pods_per_second"]),
        "gang_groups_per_second": gang["groups_per_second"],
        "groups": gang.get("groups", 0),
        "groups_placed_whole": gang.get("groups_placed_whole", 0),
        "partial_groups_seen": gang.get("partial_groups_seen", 0),
        "max_partial_groups_at_once": gang.get("max_partial_groups_at_once"),
        "max_group_bind_spread_seconds": gang.get("max_group_bind_spread_seconds"),
        "kube_scheduler_gang_pods_per_second": kube["pods_per_second"],
        "kube_scheduler_gang_groups_per_second": kube["groups_per_second"],
        "ratio_vs_kube_scheduler_gang": ratio(gang["pods_per_second"], kube["pods_per_second"]),
        "kube_scheduler_groups": kube.get("groups", 0),
        "kube_scheduler_groups_placed_whole": kube.get("groups_placed_whole", 0),
        "kube_scheduler_partial_groups_seen": kube.get("partial_groups_seen", 0),
        "kube_scheduler_max_partial_groups_at_once": kube.get("max_partial_groups_at_once"),
    }
    out["targets_met"] = {
        "ratio_at_least_0_8": out["ratio"] is not None and out["ratio"] >= TARGET_RATIO,
        "every_group_whole": out["groups"] > 0 and out["groups_placed_whole"] == out["groups"],
        "no_partial_group": out["partial_groups_seen"] == 0,
        "ahead_of_kube_scheduler_gang": (out["ratio_vs_kube_scheduler_gang"] or 0) > 1.0,
    }
    return out


def round_order(rounds: int, kinds: Sequence[str] = KINDS) -> list[tuple[int, str]]:
    """(round, kind) in run order: ABC, CBA, ABC, ... (bench/extender_throughput.py's kinds too)."""
    return [(r, kind) for r in range(rounds) for kind in (kinds if r % 2 == 0 else tuple(reversed(kinds)))]


# --------------------------------------------------------------------------- the helper process


def round_progress() -> int:
    """(in the helper process) pods of the round in progress seen bound so far."""
    return len(st._ROUND.get("bound") or {})


# --------------------------------------------------------------------------- the rounds


class GangBench(st.ApiBench):
    """bench/scheduler_throughput.py's ApiBench with three kinds of round in their own namespaces."""

    def __init__(
        self, args: argparse.Namespace, cp: ControlPlane, driver: ProcessPoolExecutor, log: Any
    ) -> None:
        super().__init__(args, cp, driver, log)
        self.namespaces = dict(NAMESPACES)
        self.kube_args = KUBE_ARGS
        self.custom = k8s.CustomObjectsApi(st.api_client(cp.admin_kubeconfig, 16))
        self.profilers: dict[str, cProfile.Profile] = {}
        self.profiling: cProfile.Profile | None = None

    def start_schedulers(self, policy_name: str, nodes: int) -> None:
        super().start_schedulers(policy_name, nodes)
        if self.args.profile:
            self._profile_scheduling_thread()
        if self.args.what_if_quiet:
            self._silence_events()

    def _silence_events(self) -> None:
        """What-if, not the shipped code (``--what-if-quiet``): kubegpu posts no Events (a waiting
        pod's FailedScheduling, a PodGroup's Unschedulable and Timeout). They go through the pool
        that also sends the Bindings; this shows what they cost the gang rounds."""
        assert self.kubegpu is not None

        def nothing(*_args: Any, **_kwargs: Any) -> None:
            return None

        self.kubegpu._post_failed = nothing  # type: ignore[method-assign]
        self.kubegpu._post_group_event = nothing  # type: ignore[method-assign]

    def _profile_scheduling_thread(self) -> None:
        """cProfile kubegpu's scheduling thread while ``self.profiling`` is set (``--profile``)."""
        assert self.kubegpu is not None
        original = self.kubegpu.schedule_next

        def profiled(timeout: float) -> bool:
            profiler = self.profiling
            if profiler is None:
                return original(timeout)
            profiler.enable()
            try:
                return original(timeout)
            finally:
                profiler.disable()

        self.kubegpu.schedule_next = profiled  # type: ignore[method-assign]

    def api_of(self, kind: str) -> str | None:
        if kind == GANG:
            return PLUGINS_API if self.args.group_api == "plugins" else KUBE_API
        return KUBE_API if kind == KUBE_GANG else None

    def groups_in_kubegpu(self, api: str, namespace: str) -> int:
        assert self.kubegpu is not None
        with self.kubegpu.cond:
            specs = self.kubegpu.groups.specs
            return sum(1 for ref in specs if ref.api == api and ref.namespace == namespace)

    def create_groups(self, kind: str, names: list[str]) -> None:
        """The round's PodGroups, before its pods; kubegpu's rounds wait until its cache has them."""
        api = self.api_of(kind)
        if api is None:
            return
        namespace, size = self.namespaces[kind], self.args.group_size
        version = PLUGINS_VERSION if api == PLUGINS_API else KUBE_VERSION
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda n: self.custom.create_namespaced_custom_object(
                        api, version, namespace, PLURAL, pod_group(api, n, size), _preload_content=False
                    ),
                    names,
                )
            )
        if kind == KUBE_GANG:
            time.sleep(1.0)  # kube-scheduler's informer: there is no way to ask it
        else:
            st.wait_until(
                lambda: self.groups_in_kubegpu(api, namespace) >= len(names),
                60,
                "kubegpu to see the PodGroups",
            )

    def count_events(self, namespace: str) -> dict[str, int]:
        """Events in ``namespace`` by (source component, reason)."""
        response = self.core.list_namespaced_event(namespace, _preload_content=False)
        counts: Counter[str] = Counter()
        for event in json.loads(response.data).get("items") or []:
            source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or "?"
            counts[f"{source}/{event.get('reason')}"] += 1
        return dict(counts)

    def clean(self, kind: str) -> None:
        """Delete the round's pods (and wait), PodGroups and Events."""
        namespace = self.namespaces[kind]
        self.delete_pods(namespace)
        for api, version in ((KUBE_API, KUBE_VERSION), (PLUGINS_API, PLUGINS_VERSION)):
            self.custom.delete_collection_namespaced_custom_object(
                api, version, namespace, PLURAL, _preload_content=False
            )
            self.release_groups(api, version, namespace)

        def groups_gone() -> bool:
            for api, version in ((KUBE_API, KUBE_VERSION), (PLUGINS_API, PLUGINS_VERSION)):
                listed = self.custom.list_namespaced_custom_object(api, version, namespace, PLURAL, limit=1)
                if listed.get("items") or self.groups_in_kubegpu(api, namespace):
                    return False
            return True

        st.wait_until(groups_gone, 120, f"the PodGroups of {namespace} to go")
        self.core.delete_collection_namespaced_event(namespace, _preload_content=False)

    def release_groups(self, api: str, version: str, namespace: str) -> None:
        """Remove the finalizers of the deleted PodGroups in ``namespace``. The apiserver gives
        Kubernetes' PodGroups ``scheduling.k8s.io/podgroup-protection``, which kube-controller-manager
        (not run here) removes once no pod uses the group; the pods are gone, so do as it would."""
        listed = self.custom.list_namespaced_custom_object(api, version, namespace, PLURAL)["items"]
        held = [item["metadata"]["name"] for item in listed if item["metadata"].get("finalizers")]
        patch = {"metadata": {"finalizers": None}}

        def release(name: str) -> None:
            try:
                self.custom.patch_namespaced_custom_object(
                    api, version, namespace, PLURAL, name, patch, _preload_content=False
                )
            except k8s.ApiException as error:
                if error.status != 404:  # gone already
                    raise

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(release, held))

    def wait_for_binds(self, count: int) -> None:
        """Until every pod is seen bound, no new bind came for ``--stall-seconds``, or the round's
        timeout passed."""
        args = self.args
        started = last_change = time.monotonic()
        seen = -1
        while True:
            bound = self.driver.submit(round_progress).result()
            now = time.monotonic()
            if bound != seen:
                seen, last_change = bound, now
            if bound >= count or now - last_change > args.stall_seconds or now - started > args.round_timeout:
                return
            time.sleep(0.2)

    def gang_round(self, kind: str, r: int, backlog: bool) -> dict[str, Any]:
        """One round of ``kind``; its entry (rate, group account, CPU); deletes what it made."""
        assert self.kubegpu is not None
        args = self.args
        namespace = self.namespaces[kind]
        scheduler = st.KUBE_SCHEDULER_NAME if kind == KUBE_GANG else st.KUBEGPU_NAME
        prefix = f"{'b' if backlog else 'c'}{r}"
        api = self.api_of(kind)
        groups = [group_name(prefix, g) for g in range(args.groups)]
        order = arrival_order(args.groups, args.group_size, args.arrival == "interleaved")
        names = [member_name(groups[g], m) for g, m in order]
        group_of = {member_name(groups[g], m): groups[g] for g, m in order}
        bodies = [
            json.dumps(member_pod(namespace, name, scheduler, group_of[name] if api else None, api)).encode()
            for name in names
        ]
        if backlog and kind == KUBE_GANG:
            self.kube_scheduler.stop()
        self.create_groups(kind, groups)
        if backlog and kind != KUBE_GANG:
            self.kubegpu.leading.clear()
            time.sleep(1.0)  # the run loop notices within 0.5 s
        self.profiling = self.profilers.setdefault(kind, cProfile.Profile()) if args.profile and (
            kind != KUBE_GANG
        ) else None
        pids = self.pids()
        cpu_before = {c: st.process_cpu_seconds(p) for c, p in pids.items()}
        cpu_before["bench-process"] = st.own_cpu_seconds()
        threads_before = st.thread_cpu_seconds()
        created = self.driver.submit(
            st.start_round,
            str(self.cp.admin_kubeconfig),
            namespace,
            scheduler,
            prefix,
            len(bodies),
            args.create_threads,
            args.round_timeout,
            bodies,
        ).result()
        released = None
        if backlog:
            if kind == KUBE_GANG:
                released = time.time()
                self.kube_scheduler = self.cp.start_scheduler(self.kube_config, extra_args=self.kube_args)
                pids = self.pids()
                cpu_before["kube-scheduler"] = 0.0  # a new process
            else:
                st.wait_until(
                    lambda: self.pending_in_kubegpu(namespace) >= len(bodies), 60, "kubegpu to see the pods"
                )
                released = time.time()
                self.kubegpu.leading.set()
        self.wait_for_binds(len(bodies))
        bound = self.driver.submit(st.finish_round, 0.0).result()
        cpu_after = {c: st.process_cpu_seconds(p) for c, p in pids.items()}
        cpu_after["bench-process"] = st.own_cpu_seconds()
        threads = st.thread_cpu_delta(threads_before, st.thread_cpu_seconds())
        self.profiling = None
        listed = json.loads(self.core.list_namespaced_pod(namespace, _preload_content=False).data)["items"]
        account = (
            account_groups(bound["binds"], group_of, args.group_size, bound_per_group(listed, group_of))
            if api
            else None
        )
        cpu = {c: round(cpu_after[c] - cpu_before.get(c, 0.0), 2) for c in cpu_after}
        cpu["pod-creator"] = round(bound["cpu_seconds"], 2)
        end = bound["last_bound"] or time.time()
        window = end - bound["first_bound"] if bound["first_bound"] else 0.0
        seconds = window if backlog else end - created["first_create"]
        entry = {
            "round": r,
            "pods": len(bodies),
            "bound": bound["bound"],
            "bound_listed": sum(1 for p in listed if (p.get("spec") or {}).get("nodeName")),
            "seconds": round(seconds, 3),
            "pods_per_second": round(bound["bound"] / seconds, 1) if seconds else 0.0,
            "groups_per_second": round(account.whole / seconds, 2) if account and seconds else None,
            "create_seconds": round(created["last_created"] - created["first_create"], 3),
            "release_to_first_bound_seconds": (
                round(bound["first_bound"] - released, 3) if released and bound["first_bound"] else None
            ),
            "groups": account.as_json() if account else None,
            "cpu_seconds": cpu,
            "kubegpu_threads_cpu_seconds": threads,
            "events": self.count_events(namespace),
            "errors": created["errors"],
            "watch_restarts": bound["watch_restarts"],
        }
        self.log(
            f"{'backlog' if backlog else 'concurrent'} round {r} {kind}: "
            f"{bound['bound']}/{len(bodies)} bound "
            f"in {seconds:.2f} s ({entry['pods_per_second']} pods/s, {entry['groups_per_second']} groups/s); "
            f"groups {entry['groups']}; cpu s {cpu}; kubegpu threads {entry['kubegpu_threads_cpu_seconds']}"
        )
        if bound["bound"] < len(bodies):
            self.log(f"only {bound['bound']} of {len(bodies)} bound; logs:\n{self.cp.log_tails(20)}")
        self.clean(kind)
        return entry

    def kind_rounds(self, backlog: bool) -> dict[str, dict[str, Any]]:
        """Every kind's rounds, interleaved (``round_order``): each kind's summary."""
        entries: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        for r, kind in round_order(self.args.rounds):
            entries[kind].append(self.gang_round(kind, r, backlog))
        return {kind: kind_summary(entries[kind]) for kind in KINDS}


def install_crds(cp: ControlPlane) -> None:
    """scheduler-plugins' PodGroup CRD from deploy/crds/, once established."""
    api = cp.admin_client()
    try:
        apply_manifests(api, [CRDS])
        extensions = k8s.ApiextensionsV1Api(api)

        def established() -> bool:
            crd = extensions.read_custom_resource_definition(f"{PLURAL}.{PLUGINS_API}")
            return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

        st.wait_until(established, 30, "the PodGroup CRD to be established")
    finally:
        api.close()


def kube_scheduler_version(cp: ControlPlane) -> str:
    try:
        done = subprocess.run(
            [str(cp.binaries.scheduler), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        return done.stdout.strip() or done.stderr.strip()
    except OSError as error:
        return f"unknown ({error})"


def profile_text(profiler: cProfile.Profile, sort: str, lines: int = 30) -> str:
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(sort).print_stats(lines)
    return text.getvalue()


def run(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    policy_name, note = st.live_default_policy()
    load_start = os.getloadavg()[0]
    with st.bench_plane(
        lambda cp, driver: GangBench(args, cp, driver, log),
        log,
        plane=lambda: ControlPlane(apiserver_extra_args=POD_GROUP_API_ARGS),
        prepare=install_crds,
    ) as (bench, cp, names, nodes_seconds):
        assert isinstance(bench, GangBench)
        try:
            bench.start_schedulers(policy_name, len(names))
            concurrent = bench.kind_rounds(backlog=False)
            backlog = bench.kind_rounds(backlog=True) if args.backlog else None
        finally:
            bench.stop()
        version = kube_scheduler_version(cp)
    report: dict[str, Any] = {
        **headline(concurrent),
        "nodes": len(names),
        "groups_per_round": args.groups,
        "group_size": args.group_size,
        "min_member": args.group_size,
        "rounds": args.rounds,
        "kubegpu_group_api": f"{PODGROUP_API_NAMES[args.group_api]}",
        "kube_scheduler_group_api": PODGROUP_API_NAMES["kube"],
        "arrival": args.arrival,
        "kube_scheduler": version,
        "kube_scheduler_args": list(KUBE_ARGS),
        "kube_scheduler_qps_burst": args.kube_qps,
        "kubegpu_policy": policy_name,
        "policy_note": note,
        "kubegpu_bind_workers": args.bind_workers,
        "create_threads": args.create_threads,
        "profiled": args.profile,
        "what_if_quiet": args.what_if_quiet,
        "node_setup_seconds": round(nodes_seconds, 1),
        "cpus": os.cpu_count(),
        "loadavg_1m_at_start": round(load_start, 2),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "detail": concurrent,
    }
    if backlog is not None:
        report["backlog"] = {**headline(backlog), "detail": backlog}
    if args.profile:
        report["profile"] = {
            kind: {"tottime": profile_text(p, "tottime"), "cumulative": profile_text(p, "cumulative")}
            for kind, p in bench.profilers.items()
        }
    return report


PODGROUP_API_NAMES = {
    "kube": f"{KUBE_API}/{KUBE_VERSION} (spec.schedulingPolicy.gang.minCount)",
    "plugins": f"{PLUGINS_API}/{PLUGINS_VERSION} (spec.minMember)",
}


# --------------------------------------------------------------------------- main


def print_table(report: Mapping[str, Any]) -> None:
    print(
        f"{report['nodes']} nodes x 8 GPUs; {report['groups_per_round']} groups of {report['group_size']} "
        f"one-GPU pods per round, {report['rounds']} rounds per kind ({report['arrival']} arrival); "
        f"kubegpu groups: {report['kubegpu_group_api']}"
    )
    sections = [("pods created while scheduling", report)]
    if "backlog" in report:
        sections.append(("backlog (first -> last bind)", report["backlog"]))
    for label, section in sections:
        detail = section["detail"]
        print(f"{label}: medians over rounds")
        print(f"  {'':<22}{'pods/s':>9}{'groups/s':>10}{'whole':>9}{'partial':>9}{'max partial at once':>21}")
        for kind in KINDS:
            s = detail[kind]
            whole = f"{s.get('groups_placed_whole', '-')}/{s.get('groups', '-')}" if "groups" in s else "-"
            print(
                f"  {kind:<22}{s['pods_per_second']!s:>9}{s['groups_per_second']!s:>10}{whole:>9}"
                f"{s.get('partial_groups_seen', '-')!s:>9}{s.get('max_partial_groups_at_once', '-')!s:>21}"
            )
        print(
            f"  ratio gang / plain {section['ratio']} (target >= {TARGET_RATIO}); "
            f"gang / kube-scheduler gang {section['ratio_vs_kube_scheduler_gang']} (target > 1)"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--quick", action="store_true", help="--nodes 50 --groups 20 unless given")
    parser.add_argument("--nodes", type=int, default=None, help=f"Node objects of 8 GPUs ({FULL['nodes']})")
    parser.add_argument("--groups", type=int, default=None, help=f"groups per round ({FULL['groups']})")
    parser.add_argument("--group-size", type=int, default=8, help="one-GPU pods per group, all its minimum")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per kind, interleaved")
    parser.add_argument(
        "--group-api", choices=("kube", "plugins"), default="kube", help="the API of kubegpu's PodGroups"
    )
    parser.add_argument("--arrival", choices=("grouped", "interleaved"), default="grouped")
    st.add_api_arguments(parser)
    parser.add_argument(
        "--stall-seconds", type=float, default=30.0, help="a round ends after this long without a bind"
    )
    parser.add_argument(
        "--backlog", action="store_true", help="also rounds whose pods exist before the scheduler starts"
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile kubegpu's scheduling thread (slows it)"
    )
    parser.add_argument(
        "--what-if-quiet",
        action="store_true",
        help="diagnostic: kubegpu posts no Events (see docs/performance.md); not the shipped behaviour",
    )
    args = parser.parse_args(argv)
    st.fill_sizes(args, QUICK, FULL)
    problem = size_problem(args.nodes, args.groups, args.group_size)
    if problem is None and args.rounds < 1:
        problem = "--rounds must be at least 1"
    if problem:
        parser.error(problem)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = st.logger(args.json)
    log(
        f"{args.nodes} nodes, {args.groups} groups of {args.group_size} per round, "
        f"{args.rounds} rounds per kind "
        f"(kinds: {', '.join(KINDS)}) ..."
    )
    report = run(args, log)
    if args.profile:
        for kind, texts in report["profile"].items():
            log(f"--- cProfile of kubegpu's scheduling thread, {kind} rounds (tottime)\n{texts['tottime']}")
    st.print_report(report, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
