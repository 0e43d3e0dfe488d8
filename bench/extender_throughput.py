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
  counts ``nvidia.com/gpu`` as an extended resource and binds the pod itself.

Pods are created, and binds observed, by a separate process (``scheduler_throughput.start_round``);
a round's rate is bound pods / (last pod seen bound - first pod creation). Headline figures are
medians over the rounds of a kind. Between rounds the pods are force-deleted, so every round starts
on empty nodes. HAMi's scheduler extender is not part of it: docs/performance.md says why.

Usage::

    python bench/extender_throughput.py [--json] [--quick] [--nodes N] [--pods N] [--rounds N]
        [--verbs shipped|scored]

``--quick`` is ``--nodes 50 --pods 200``. ``--verbs scored`` has kube-scheduler call ``filter`` and
``prioritize`` (weight 5) instead of the shipped stanza's ``filterVerb: choose``. Prints a table,
then one JSON object (only the JSON object with ``--json``): ``extender_pods_per_second``,
``kubegpu_pods_per_second``, ``plain_pods_per_second``, ``ratio_extender_plain`` (target at least
0.7), ``ratio_kubegpu_plain``, ``extender_verbs``, the per-round detail and CPU seconds per
process, and where a pod's time goes (``mean_latency_ms``: the extender's mean answer time per verb
and each kube-scheduler's mean scheduling algorithm and extension point durations, from their
/metrics, over all rounds).
"""

from __future__ import annotations

import argparse
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/scheduler_throughput.py

import gang_throughput  # noqa: E402
import scheduler_throughput as st  # noqa: E402
import yaml  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from gang_throughput import kube_scheduler_version, median_or_none, ratio  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kubegpu.devenv.controlplane import ControlPlane  # noqa: E402
from kubegpu.devenv.shimproc import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KUBE_SCHEDULER_STANZA = ROOT / "deploy" / "extender" / "kube-scheduler-config.yaml"
EXTENDER, KUBEGPU, PLAIN = "extender", "kubegpu", "plain"
KINDS = (EXTENDER, KUBEGPU, PLAIN)
SCHEDULER_NAMES = {EXTENDER: "bench-extender", KUBEGPU: st.KUBEGPU_NAME, PLAIN: st.KUBE_SCHEDULER_NAME}
NAMESPACES = {
    EXTENDER: "bench-ext-extender",
    KUBEGPU: "bench-ext-kubegpu",
    PLAIN: "bench-ext-plain",
}
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


def round_order(rounds: int) -> list[tuple[int, str]]:
    """(round, kind) in run order: ABC, CBA, ABC, ... (``gang_throughput.round_order``)."""
    return gang_throughput.round_order(rounds, KINDS)


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
    """The issue's figures from the three kinds' summaries."""
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
    return out


# --------------------------------------------------------------------------- the rounds


class ExtenderBench(st.ApiBench):
    """bench/scheduler_throughput.py's ApiBench with a third kind: kube-scheduler + kubegpu extender."""

    def __init__(
        self, args: argparse.Namespace, cp: ControlPlane, driver: ProcessPoolExecutor, log: Any
    ) -> None:
        super().__init__(args, cp, driver, log)
        self.namespaces = {SCHEDULER_NAMES[k]: NAMESPACES[k] for k in KINDS}
        self.extender: subprocess.Popen[bytes] | None = None
        self.extender_port = 0
        self.ext_scheduler: Any = None
        self.workdir = Path(tempfile.mkdtemp(prefix="kubegpu-bench-extender-"))

    def start_schedulers(self, policy_name: str, nodes: int) -> None:
        super().start_schedulers(policy_name, nodes)  # kubegpu in this process, plain kube-scheduler
        self.extender_port = free_port()
        self.extender = self._start_extender(policy_name)
        base = f"http://127.0.0.1:{self.extender_port}"
        st.wait_until(lambda: _http_ok(base + "/readyz"), 120, "kubegpu extender to be ready")
        stanza = yaml.safe_load(KUBE_SCHEDULER_STANZA.read_text())
        config = extender_scheduler_config(stanza, self.extender_port, self.args.kube_qps, self.args.verbs)
        self.ext_scheduler = self.cp.start_scheduler(config)

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
            elif name.startswith("kube-scheduler"):
                out["kube-scheduler-plain"] = pid
            else:
                out[name] = pid
        if self.extender is not None and self.extender.poll() is None:
            out["kubegpu-extender"] = self.extender.pid
        return out

    def stop(self) -> None:
        super().stop()
        if self.extender is not None and self.extender.poll() is None:
            self.extender.terminate()
            try:
                self.extender.wait(30)
            except subprocess.TimeoutExpired:
                self.extender.kill()
                self.extender.wait(30)
        shutil.rmtree(self.workdir, ignore_errors=True)  # its keys, configuration and log

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
        for name, component in (("extender", self.ext_scheduler), ("plain", self.scheduler_component())):
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
            if c.name.startswith("kube-scheduler") and c is not self.ext_scheduler:
                return c
        return None

    def extender_log(self, lines: int = 20) -> str:
        path = self.workdir / "extender.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def kind_rounds(self) -> dict[str, dict[str, Any]]:
        """Every kind's rounds, interleaved (``round_order``): each kind's summary."""
        results = {k: st.SchedulerRounds(k) for k in KINDS}
        counts = self.args.pods
        for r, kind in round_order(self.args.rounds):
            self.round(SCHEDULER_NAMES[kind], r, counts, False, results[kind])
            if results[kind].rounds[-1]["bound"] < counts and kind == EXTENDER:
                self.log(f"kubegpu extender log:\n{self.extender_log()}")
        return {k: kind_summary(results[k].rounds) for k in KINDS}


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
        "hami": "not measured: it builds and runs, but binds one pod per node without its device plugin "
        "(docs/performance.md)",
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
    }
    for kind in KINDS:
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
        f"({', '.join(KINDS)}) ..."
    )
    report = run(args, log)
    st.print_report(report, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
