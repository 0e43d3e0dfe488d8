"""Benchmark: kube-scheduler with kubegpu as its extender, against a real apiserver (issue 23).

One control plane (etcd + kube-apiserver v1.37.2) and one node set (by default 500 Nodes of 8
GPUs, advertised as the kubegpu advertiser leaves them; bench/scheduler_throughput.py's machinery).
Three kinds of round, each in its own namespace and for its own scheduler name, each placing the
same one-GPU pods (by default 1,000 a round), interleaved (ABC CBA ABC ...) so that machine noise
hits every kind:

- ``extender``: kube-scheduler v1.37.2 (a process; profile ``bench-extender``) configured with
  the extenders stanza of deploy/extender/kube-scheduler-config.yaml, pointed at ``kubegpu
  extender`` (a process, as deployed: one replica, no leader election) on a loopback port.
  kube-scheduler calls ``choose`` (filter narrowed to kubegpu's pick, so it skips scoring) for
  each pod, or with ``--verbs scored`` filter and prioritize, and binds it through the extender's
  bind (the signed allocation);
- ``kubegpu``: kubegpu's own live ``Scheduler`` (in this process, as bench/scheduler_throughput.py
  runs it);
- ``plain``: a second kube-scheduler process (profile ``default-scheduler``, no extender) that
  counts ``nvidia.com/gpu`` as an extended resource and binds the pod itself;
- ``hami`` (only with ``--hami-binary PATH``): HAMi's scheduler extender (a process, HAMi's
  ``cmd/scheduler`` built from its public source) behind a third kube-scheduler with the HAMi
  chart's extender stanza (filter and bind), the Nodes given the register annotation HAMi's device
  plugin writes, and a stand-in for that device plugin's Allocate-time lock release (its own
  process, bench/hami_peer.py) without which HAMi binds one pod per node and stops.

Pods are created, and binds observed, by a separate process (``scheduler_throughput.start_round``);
a round's rate is bound pods / (last pod seen bound - first pod creation). Headline figures are
medians over the rounds of a kind. Between rounds the pods are force-deleted, so every round starts
on empty nodes. The CPU of every process is counted in every round, the HAMi kind's processes
included.

Usage::

    python bench/extender_throughput.py [--json] [--quick] [--nodes N] [--pods N] [--rounds N]
        [--verbs shipped|scored] [--hami-binary PATH [--hami-node-policy binpack|spread]]

``--quick`` is ``--nodes 50 --pods 200``. ``--verbs scored`` has kube-scheduler call ``filter`` and
``prioritize`` (weight 5) instead of the shipped stanza's ``filterVerb: choose``. Prints a table,
then one JSON object (only the JSON object with ``--json``): ``extender_pods_per_second``,
``kubegpu_pods_per_second``, ``plain_pods_per_second``, ``ratio_extender_plain`` (target at least
0.7), ``ratio_kubegpu_plain``, ``extender_verbs``, the per-round detail and CPU seconds per
process, with ``--hami-binary`` also ``hami_pods_per_second``, ``ratio_hami_plain`` and
``hami_note`` (what the stand-in does), and where a pod's time goes (``mean_latency_ms``: the
extender's mean answer time per verb and each kube-scheduler's mean scheduling algorithm and
extension point durations, from their /metrics, over all rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/scheduler_throughput.py

import gang_throughput  # noqa: E402
import hami_peer  # noqa: E402
import scheduler_throughput as st  # noqa: E402
import yaml  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from gang_throughput import kube_scheduler_version, median_or_none, ratio  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kubegpu.devenv.controlplane import ControlPlane  # noqa: E402
from kubegpu.devenv.shimproc import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KUBE_SCHEDULER_STANZA = ROOT / "deploy" / "extender" / "kube-scheduler-config.yaml"
EXTENDER, KUBEGPU, PLAIN, HAMI = "extender", "kubegpu", "plain", "hami"
KINDS = (EXTENDER, KUBEGPU, PLAIN)  # always run; HAMI is added with --hami-binary
SCHEDULER_NAMES = {
    EXTENDER: "bench-extender",
    KUBEGPU: st.KUBEGPU_NAME,
    PLAIN: st.KUBE_SCHEDULER_NAME,
    HAMI: hami_peer.SCHEDULER_NAME,
}
NAMESPACES = {
    EXTENDER: "bench-ext-extender",
    KUBEGPU: "bench-ext-kubegpu",
    PLAIN: "bench-ext-plain",
    HAMI: hami_peer.NAMESPACE,
}
HAMI_NOTE = (
    "HAMi's scheduler (cmd/scheduler) behind kube-scheduler with the HAMi chart's extender stanza "
    "(filter, bind); Nodes carry the hami.io/node-nvidia-register annotation its device plugin writes; "
    "no kubelet nor device plugin, so a stand-in process (bench/hami_peer.py, CPU counted in every "
    "round) makes, for each pod seen bound in bind-phase allocating, the API calls HAMi's device "
    "plugin makes in Allocate: GET node, GET pod, PATCH pod devices-to-allocate erased, GET pod, PATCH "
    "pod bind-phase success, GET node, GET node, PATCH node hami.io/mutex.lock null (resourceVersion "
    "precondition), one pod at a time per node. HAMi binds to a node only while no lock is on it, so the "
    "stand-in's latency is part of every HAMi bind after a node's first; kubelet's own admission "
    "work is left out (a real node releases later)."
)
TARGET_RATIO = 0.7
SHIPPED, SCORED = "shipped", "scored"
QUICK = {"nodes": 50, "pods": 200}
FULL = {"nodes": 500, "pods": 1000}
EXTENDER_HISTOGRAMS = ("kubegpu_extender_request_duration_seconds",)
KUBE_SCHEDULER_HISTOGRAMS = (
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_framework_extension_point_duration_seconds",
)


# --------------------------------------------------------------------------- pure parts


def extender_scheduler_config(
    stanza: Mapping[str, Any], port: int, qps: int, verbs: str = SHIPPED
) -> dict[str, Any]:
    """kube-scheduler's config for the extender kind: the shipped ``extenders`` stanza with its URL
    pointed at ``http://127.0.0.1:PORT``, one profile ``bench-extender``. ``verbs``: ``shipped``
    keeps the stanza's verbs (``filterVerb: choose``: kubegpu narrows the nodes to its own choice),
    ``scored`` has kube-scheduler filter with ``filter`` and score with ``prioritize`` (weight 5)."""
    extenders = [dict(e) for e in stanza["extenders"]]
    for extender in extenders:
        extender["urlPrefix"] = f"http://127.0.0.1:{port}"
        if verbs == SCORED:
            extender.update(filterVerb="filter", prioritizeVerb="prioritize", weight=5)
    return {
        "clientConnection": {"qps": qps, "burst": qps},
        "profiles": [{"schedulerName": SCHEDULER_NAMES[EXTENDER]}],
        "extenders": extenders,
    }


def histogram_means_ms(text: str, names: Sequence[str]) -> dict[str, float]:
    """Mean of each named Prometheus histogram series in ``text``, in ms: ``name{label=value,...}``
    (labels sorted) -> sum / count, for the series with at least one observation."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in names:
            continue
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "le")
            key = f"{family.name}{{{labels}}}"
            if sample.name.endswith("_sum"):
                sums[key] = sample.value
            elif sample.name.endswith("_count"):
                counts[key] = sample.value
    return {k: round(1000 * sums[k] / n, 3) for k, n in sorted(counts.items()) if n and k in sums}


def round_order(rounds: int, kinds: Sequence[str] = KINDS) -> list[tuple[int, str]]:
    """(round, kind) in run order: ABC, CBA, ABC, ... (``gang_throughput.round_order``)."""
    return gang_throughput.round_order(rounds, tuple(kinds))


def bench_kinds(hami_binary: str | None) -> tuple[str, ...]:
    """The kinds a run measures: the three always, HAMi's fourth only with its binary."""
    return (*KINDS, HAMI) if hami_binary else KINDS


def kind_summary(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians (and ranges) over a kind's rounds, CPU seconds summed."""
    rates = [r["pods_per_second"] for r in rounds]
    cpu: Counter[str] = Counter()
    for r in rounds:
        cpu.update(r["cpu_seconds"])
    return {
        "rounds": len(rounds),
        "pods_per_second": median_or_none(rates),
        "pods_per_second_range": [min(rates), max(rates)] if rates else None,
        "pods": sum(r["pods"] for r in rounds),
        "bound": sum(r["bound"] for r in rounds),
        "cpu_seconds": {k: round(v, 2) for k, v in sorted(cpu.items())},
        "per_round": list(rounds),
    }


def headline(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The issue's figures from the three kinds' summaries (and HAMi's, when it ran)."""
    ext, ours, plain = (summaries[k]["pods_per_second"] for k in KINDS)
    out: dict[str, Any] = {
        "extender_pods_per_second": ext,
        "kubegpu_pods_per_second": ours,
        "plain_pods_per_second": plain,
        "ratio_extender_plain": ratio(ext, plain),
        "ratio_kubegpu_plain": ratio(ours, plain),
    }
    out["targets_met"] = {
        "ratio_extender_plain_at_least_0_7": (out["ratio_extender_plain"] or 0) >= TARGET_RATIO,
        "every_pod_bound": all(summaries[k]["bound"] == summaries[k]["pods"] > 0 for k in KINDS),
    }
    if HAMI in summaries:
        hami = summaries[HAMI]
        out["hami_pods_per_second"] = hami["pods_per_second"]
        out["ratio_hami_plain"] = ratio(hami["pods_per_second"], plain)
        out["hami_every_pod_bound"] = hami["bound"] == hami["pods"] > 0
    return out


# --------------------------------------------------------------------------- the rounds


class ExtenderBench(st.ApiBench):
    """bench/scheduler_throughput.py's ApiBench with a third kind, kube-scheduler + kubegpu
    extender, and with ``--hami-binary`` a fourth: kube-scheduler + HAMi's extender."""

    def __init__(
        self, args: argparse.Namespace, cp: ControlPlane, driver: ProcessPoolExecutor, log: Any
    ) -> None:
        super().__init__(args, cp, driver, log)
        self.kinds = bench_kinds(args.hami_binary)
        self.namespaces = {SCHEDULER_NAMES[k]: NAMESPACES[k] for k in self.kinds}
        self.extender: subprocess.Popen[bytes] | None = None
        self.extender_port = 0
        self.ext_scheduler: Any = None
        self.hami: subprocess.Popen[bytes] | None = None
        self.hami_port = 0
        self.hami_scheduler: Any = None
        self.stand_in: subprocess.Popen[bytes] | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="kubegpu-bench-extender-"))

    def create_nodes(self, state: str) -> list[str]:
        """ApiBench's nodes; with the HAMi kind each also gets the annotation HAMi's device plugin
        registers its GPUs with (``hami_peer.node_annotations``)."""
        names = super().create_nodes(state)
        if HAMI in self.kinds:

            def annotate(name: str) -> None:
                self.core.patch_node(name, {"metadata": {"annotations": hami_peer.node_annotations(name)}})

            with ThreadPoolExecutor(max_workers=self.args.node_threads) as pool:
                list(pool.map(annotate, names))
        return names

    def start_schedulers(self, policy_name: str, nodes: int) -> None:
        super().start_schedulers(policy_name, nodes)  # kubegpu in this process, plain kube-scheduler
        self.extender_port = free_port()
        self.extender = self._start_extender(policy_name)
        base = f"http://127.0.0.1:{self.extender_port}"
        st.wait_until(lambda: _http_ok(base + "/readyz"), 120, "kubegpu extender to be ready")
        stanza = yaml.safe_load(KUBE_SCHEDULER_STANZA.read_text())
        config = extender_scheduler_config(stanza, self.extender_port, self.args.kube_qps, self.args.verbs)
        self.ext_scheduler = self.cp.start_scheduler(config)
        if HAMI in self.kinds:
            self._start_hami(nodes)

    def _start_hami(self, nodes: int) -> None:
        """HAMi's scheduler (ready, and its handshake written on every Node: it has registered
        them), the device plugin's stand-in, and kube-scheduler with HAMi's stanza."""
        config_file = self.workdir / "hami-device-config.yaml"
        config_file.write_text(yaml.safe_dump(hami_peer.device_config()))
        self.hami_port = free_port()
        args = hami_peer.scheduler_args(
            Path(self.args.hami_binary),
            self.hami_port,
            free_port(),
            config_file,
            self.args.kube_qps,
            self.args.hami_node_policy,
        )
        env = {**os.environ, "KUBECONFIG": str(self.cp.admin_kubeconfig)}
        self.hami = subprocess.Popen(
            args, stdout=(self.workdir / "hami.log").open("wb"), stderr=subprocess.STDOUT, env=env
        )
        base = f"http://127.0.0.1:{self.hami_port}"
        st.wait_until(lambda: _http_ok(base + "/healthz"), 120, "HAMi's scheduler to answer")
        st.wait_until(lambda: self._hami_handshakes() >= nodes, 180, "HAMi to register every node")
        self.stand_in = subprocess.Popen(
            [
                sys.executable,
                str(Path(hami_peer.__file__).resolve()),
                "--kubeconfig",
                str(self.cp.admin_kubeconfig),
                "--namespace",
                NAMESPACES[HAMI],
            ],
            stdout=(self.workdir / "stand-in.log").open("wb"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.hami_scheduler = self.cp.start_scheduler(
            hami_peer.scheduler_config(self.hami_port, self.args.kube_qps)
        )

    def _hami_handshakes(self) -> int:
        """Nodes whose ``hami.io/node-handshake`` HAMi's scheduler has written."""
        page = json.loads(self.core.list_node(_preload_content=False).data)
        return sum(
            1
            for n in page.get("items") or []
            if ((n.get("metadata") or {}).get("annotations") or {}).get(hami_peer.HANDSHAKE_ANNOTATION)
        )

    def _start_extender(self, policy_name: str) -> subprocess.Popen[bytes]:
        """``kubegpu extender`` as deployed (its own process), with the bench's signing key."""
        keys = self.workdir / "keys"
        keys.mkdir()
        pem = st.KEYS["k1"].private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        (keys / "k1").write_bytes(pem)
        config = self.workdir / "extender.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "keysDir": str(keys),
                    "signingKeyId": "k1",
                    "policy": policy_name,
                    "bindWorkers": self.args.bind_workers,
                    "heartbeatStaleSeconds": 86400.0,  # no advertiser keeps the heartbeats fresh here
                }
            )
        )
        log = (self.workdir / "extender.log").open("wb")
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "extender",
                "--config",
                str(config),
                "--kubeconfig",
                str(self.cp.admin_kubeconfig),
                "--scheduler-name",
                SCHEDULER_NAMES[EXTENDER],
                "--address",
                f"127.0.0.1:{self.extender_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def pids(self) -> dict[str, int]:
        pids = {c.name: c.process.pid for c in self.cp.components if c.process is not None and c.alive()}
        out = {}
        for name, pid in pids.items():
            if self.ext_scheduler is not None and name == self.ext_scheduler.name:
                out["kube-scheduler-extender"] = pid
            elif self.hami_scheduler is not None and name == self.hami_scheduler.name:
                out["kube-scheduler-hami"] = pid
            elif name.startswith("kube-scheduler"):
                out["kube-scheduler-plain"] = pid
            else:
                out[name] = pid
        for key, process in (
            ("kubegpu-extender", self.extender),
            ("hami-scheduler", self.hami),
            ("hami-device-plugin-stand-in", self.stand_in),
        ):
            if process is not None and process.poll() is None:
                out[key] = process.pid
        return out

    def stop(self) -> None:
        super().stop()
        for process in (self.extender, self.stand_in, self.hami):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(30)
        shutil.rmtree(self.workdir, ignore_errors=True)  # its keys, configuration and logs

    def hami_log_counts(self) -> dict[str, int]:
        """Lines of HAMi's log that tell how its binds went (read before ``stop``)."""
        path = self.workdir / "hami.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return {
            "successfully_bound": text.count("Successfully bound pod to node"),
            "failed_to_lock_node": text.count("Failed to lock node"),
            "node_lock_contention": text.count("node lock contention"),
        }

    def stand_in_report(self) -> dict[str, Any]:
        """The stand-in's last report line (``hami_peer.latency_summary``), {} before any."""
        path = self.workdir / "stand-in.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        reports = [line for line in lines if line.startswith("{")]
        return dict(json.loads(reports[-1])) if reports else {}

    def stand_in_log(self, lines: int = 20) -> str:
        path = self.workdir / "stand-in.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def extender_calls(self) -> dict[str, int]:
        """``verb code`` -> requests the kubegpu extender answered (its /metrics), or {} when down."""
        text = self.extender_metrics()
        calls = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "kubegpu_extender_requests_total":
                    calls[f"{sample.labels['verb']} {sample.labels['code']}"] = int(sample.value)
        return calls

    def extender_latency_ms(self) -> dict[str, float]:
        """The kubegpu extender's mean time to answer each verb (its /metrics histogram), in ms."""
        return histogram_means_ms(self.extender_metrics(), EXTENDER_HISTOGRAMS)

    def extender_metrics(self) -> str:
        """The kubegpu extender's /metrics text ("" when it is down)."""
        url = f"http://127.0.0.1:{self.extender_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            return ""

    def kube_scheduler_latency_ms(self) -> dict[str, dict[str, float]]:
        """Each kube-scheduler's mean scheduling-cycle parts (its /metrics, read with an admin
        client certificate), in ms: the algorithm (filter and score, extenders included) and the
        framework's extension points."""
        cert, key = self.cp.pki.issue("bench-metrics", "/CN=bench-metrics/O=system:masters")
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate, on loopback
        context.load_cert_chain(str(cert), str(key))
        out = {}
        components = (
            ("extender", self.ext_scheduler),
            ("plain", self.scheduler_component()),
            ("hami", self.hami_scheduler),
        )
        for name, component in components:
            port = _secure_port(component.args) if component is not None else None
            if port is None:
                continue
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/metrics", timeout=5, context=context
                ) as response:
                    out[name] = histogram_means_ms(response.read().decode(), KUBE_SCHEDULER_HISTOGRAMS)
            except OSError as error:
                out[name] = {"unavailable": str(error)[:200]}  # type: ignore[dict-item]
        return out

    def scheduler_component(self) -> Any:
        """The plain kube-scheduler's Component (the one that is not the extender kind's)."""
        for c in self.cp.components:
            if c.name.startswith("kube-scheduler") and c not in (self.ext_scheduler, self.hami_scheduler):
                return c
        return None

    def extender_log(self, lines: int = 20) -> str:
        path = self.workdir / "extender.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def kind_rounds(self) -> dict[str, dict[str, Any]]:
        """Every kind's rounds, interleaved (``round_order``): each kind's summary."""
        results = {k: st.SchedulerRounds(k) for k in self.kinds}
        counts = self.args.pods
        for r, kind in round_order(self.args.rounds, self.kinds):
            self.round(SCHEDULER_NAMES[kind], r, counts, False, results[kind])
            if results[kind].rounds[-1]["bound"] < counts and kind == EXTENDER:
                self.log(f"kubegpu extender log:\n{self.extender_log()}")
            if results[kind].rounds[-1]["bound"] < counts and kind == HAMI:
                self.log(f"HAMi: {self.hami_log_counts()}; stand-in log:\n{self.stand_in_log()}")
        return {k: kind_summary(results[k].rounds) for k in self.kinds}


def _secure_port(args: Sequence[str]) -> int | None:
    for arg in args:
        if arg.startswith("--secure-port="):
            return int(arg.split("=", 1)[1])
    return None


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def run(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    policy_name, note = st.live_default_policy()
    load_start = os.getloadavg()
    with st.bench_plane(lambda cp, driver: ExtenderBench(args, cp, driver, log), log) as (
        bench,
        cp,
        names,
        nodes_seconds,
    ):
        assert isinstance(bench, ExtenderBench)
        try:
            bench.start_schedulers(policy_name, len(names))
            summaries = bench.kind_rounds()
            calls = bench.extender_calls()
            latency = {
                "kubegpu_extender": bench.extender_latency_ms(),
                "kube_scheduler": bench.kube_scheduler_latency_ms(),
            }
            hami_log = bench.hami_log_counts() if HAMI in bench.kinds else None
            stand_in = bench.stand_in_report() if HAMI in bench.kinds else None
        finally:
            bench.stop()
        version = kube_scheduler_version(cp)
    return {
        **headline(summaries),
        "nodes": len(names),
        "pods_per_round": args.pods,
        "rounds": args.rounds,
        "kube_scheduler": version,
        "kube_scheduler_qps_burst": args.kube_qps,
        "extender_stanza": str(KUBE_SCHEDULER_STANZA.relative_to(ROOT)),
        "extender_verbs": args.verbs,
        "kubegpu_policy": policy_name,
        "policy_note": note,
        "kubegpu_bind_workers": args.bind_workers,
        "create_threads": args.create_threads,
        "node_setup_seconds": round(nodes_seconds, 1),
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(v, 2) for v in load_start],
        "loadavg_at_end": [round(v, 2) for v in os.getloadavg()],
        "extender_calls": calls,
        "mean_latency_ms": latency,
        **(
            {
                "hami_binary": args.hami_binary,
                "hami_node_policy": args.hami_node_policy,
                "hami_note": HAMI_NOTE,
                "hami_log_counts": hami_log,
                "hami_stand_in": stand_in,
            }
            if hami_log is not None
            else {"hami": "not measured (no --hami-binary)"}
        ),
        "detail": summaries,
    }


# --------------------------------------------------------------------------- main


def print_table(report: Mapping[str, Any]) -> None:
    print(
        f"{report['nodes']} nodes x 8 GPUs; {report['pods_per_round']} one-GPU pods per round, "
        f"{report['rounds']} rounds per kind; {report['kube_scheduler']}"
    )
    print(f"  {'':<34}{'pods/s (median)':>16}{'range':>18}{'bound':>12}")
    labels = {
        EXTENDER: "kube-scheduler + kubegpu extender",
        KUBEGPU: "kubegpu scheduler",
        PLAIN: "kube-scheduler (counts GPUs)",
        HAMI: "kube-scheduler + HAMi extender",
    }
    for kind in report["detail"]:
        s = report["detail"][kind]
        print(
            f"  {labels[kind]:<34}{s['pods_per_second']!s:>16}{s['pods_per_second_range']!s:>18}"
            f"{s['bound']:>6}/{s['pods']:<5}"
        )
    print(
        f"  ratio extender / plain {report['ratio_extender_plain']} (target >= {TARGET_RATIO}); "
        f"kubegpu / plain {report['ratio_kubegpu_plain']}; load {report['loadavg_at_start']} -> "
        f"{report['loadavg_at_end']}"
    )
    if "ratio_hami_plain" in report:
        print(f"  ratio HAMi / plain {report['ratio_hami_plain']} (with the device plugin's stand-in)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--quick", action="store_true", help="--nodes 50 --pods 200 unless given")
    parser.add_argument("--nodes", type=int, default=None, help=f"Node objects of 8 GPUs ({FULL['nodes']})")
    parser.add_argument("--pods", type=int, default=None, help=f"one-GPU pods per round ({FULL['pods']})")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per kind, interleaved")
    parser.add_argument(
        "--verbs",
        choices=(SHIPPED, SCORED),
        default=SHIPPED,
        help="the extender kind's verbs: the shipped stanza's (choose) or filter + prioritize",
    )
    parser.add_argument(
        "--hami-binary",
        default=None,
        help="HAMi's cmd/scheduler binary: adds the fourth kind, kube-scheduler + HAMi's extender",
    )
    parser.add_argument(
        "--hami-node-policy",
        choices=("binpack", "spread"),
        default="binpack",
        help="HAMi's --node-scheduler-policy (the chart's default: binpack)",
    )
    st.add_api_arguments(parser)
    args = parser.parse_args(argv)
    st.fill_sizes(args, QUICK, FULL)
    if args.rounds < 1 or args.nodes < 1 or args.pods < 1:
        parser.error("--rounds, --nodes and --pods must be at least 1")
    if args.pods > args.nodes * 8:
        parser.error(f"{args.pods} one-GPU pods do not fit {args.nodes} nodes of 8 GPUs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = st.logger(args.json)
    log(
        f"{args.nodes} nodes, {args.pods} pods per round, {args.rounds} rounds per kind "
        f"({', '.join(bench_kinds(args.hami_binary))}) ..."
    )
    report = run(args, log)
    st.print_report(report, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
