"""Bad input at every ``kubegpu`` subcommand: one stderr line naming the flag or file, exit 2 for
usage errors and 1 for runtime failures, never a traceback (docs/errors.md).

The sweep runs the real CLI as a subprocess, one case per subcommand and class of bad input; the
unit tests below it pin the shared value types and the error boundary (kubegpu/cliargs.py).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kubegpu import cliargs
from kubegpu.allocation import private_key_pem
from kubegpu.inputfiles import MAX_INPUT_BYTES, MAX_TRACE_BYTES
from scheduler.live.config import ConfigError, SchedulerConfig, validate

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT = 60  # a case that starts serving instead of refusing runs into this and fails

# (id, argv with {placeholders} from the ``inputs`` fixture, exit status, what the line must name)
CASES: list[tuple[str, list[str], int, str]] = [
    # ---- kubegpu (no subcommand)
    ("top-no-command", [], 2, "COMMAND"),
    ("top-unknown-command", ["bogus"], 2, "bogus"),
    ("top-bad-log-level", ["--log-level", "loud", "simulate"], 2, "--log-level"),
    # ---- crishim
    ("crishim-negative-duration", ["crishim", "--drain-timeout", "-1"], 2, "--drain-timeout"),
    ("crishim-zero-duration", ["crishim", "--health-interval", "0"], 2, "--health-interval"),
    ("crishim-nan-duration", ["crishim", "--advertise-interval", "nan"], 2, "--advertise-interval"),
    ("crishim-absurd-duration", ["crishim", "--heartbeat-interval", "1e300"], 2, "--heartbeat-interval"),
    ("crishim-not-a-duration", ["crishim", "--drain-timeout", "soon"], 2, "--drain-timeout"),
    ("crishim-malformed-address", ["crishim", "--metrics-address", "localhost"], 2, "--metrics-address"),
    ("crishim-address-port-range", ["crishim", "--metrics-address", ":70000"], 2, "--metrics-address"),
    ("crishim-address-bad-host", ["crishim", "--metrics-address", "a b:80"], 2, "--metrics-address"),
    ("crishim-tcp-endpoint", ["crishim", "--runtime-endpoint", "tcp://127.0.0.1:1"], 2, "--runtime-endpoint"),
    ("crishim-relative-endpoint", ["crishim", "--listen", "shim.sock"], 2, "--listen"),
    ("crishim-long-endpoint", ["crishim", "--listen", "/" + "x" * 120], 2, "--listen"),
    ("crishim-unknown-plugin", ["crishim", "--device-plugin", "tpu"], 2, "--device-plugin"),
    ("crishim-bad-node-name", ["crishim", "--node-name", "Node_1"], 2, "--node-name"),
    ("crishim-missing-sysfs", ["crishim", "--sysfs-root", "{missing}"], 2, "--sysfs-root"),
    (
        "crishim-same-sockets",
        ["crishim", "--listen", "{sock}", "--runtime-endpoint", "{sock}"],
        2,
        "--listen",
    ),
    ("crishim-advertise-no-plugin", ["crishim", "--listen", "{sock}", "--advertise"], 2, "--advertise"),
    ("crishim-listen-not-socket", ["crishim", "--listen", "{file}"], 1, "{file}"),
    ("crishim-metrics-busy", ["crishim", "--listen", "{sock}", "--metrics-address", "{busy}"], 1, "{busy}"),
    ("crishim-missing-topology", ["crishim", "{shim}", "--sim-topology", "{missing}"], 2, "{missing}"),
    ("crishim-malformed-topology", ["crishim", "{shim}", "--sim-topology", "{badjson}"], 2, "{badjson}"),
    ("crishim-wrong-size-topology", ["crishim", "{shim}", "--sim-topology", "{skewed}"], 2, "{skewed}"),
    ("crishim-unreadable-topology", ["crishim", "{shim}", "--sim-topology", "{dir}"], 2, "{dir}"),
    ("crishim-missing-kubeconfig", ["crishim", "{shim-ok}", "--kubeconfig", "{missing}"], 2, "--kubeconfig"),
    (
        "crishim-malformed-kubeconfig",
        ["crishim", "{shim-ok}", "--kubeconfig", "{badyaml}"],
        2,
        "--kubeconfig",
    ),
    ("crishim-advertise-no-api", ["crishim", "{shim-ok}", "--advertise"], 2, "--kubeconfig"),
    # ---- advertise
    ("advertise-no-plugin", ["advertise", "--dry-run"], 2, "--device-plugin"),
    ("advertise-unknown-plugin", ["advertise", "--device-plugin", "fpga"], 2, "--device-plugin"),
    ("advertise-zero-duration", ["advertise", "--advertise-interval", "0"], 2, "--advertise-interval"),
    (
        "advertise-missing-topology",
        ["advertise", "{dev}", "--sim-topology", "{missing}", "--dry-run"],
        2,
        "{missing}",
    ),
    (
        "advertise-malformed-topology",
        ["advertise", "{dev}", "--sim-topology", "{badjson}", "--dry-run"],
        2,
        "{badjson}",
    ),
    (
        "advertise-missing-kubeconfig",
        ["advertise", "{dev-ok}", "--kubeconfig", "{missing}"],
        2,
        "--kubeconfig",
    ),
    (
        "advertise-unreadable-kubeconfig",
        ["advertise", "{dev-ok}", "--kubeconfig", "{dir}"],
        2,
        "--kubeconfig",
    ),
    (
        "advertise-malformed-kubeconfig",
        ["advertise", "{dev-ok}", "--kubeconfig", "{listyaml}"],
        2,
        "--kubeconfig",
    ),
    ("advertise-no-server", ["advertise", "{dev-ok}", "--kubeconfig", "{noserver}"], 2, "--kubeconfig"),
    ("advertise-no-api", ["advertise", "{dev-ok}", "--once"], 2, "--kubeconfig"),
    (
        "advertise-unreachable",
        ["advertise", "{dev-ok}", "--once", "--kubeconfig", "{closed}"],
        1,
        "cannot reach",
    ),
    # ---- devices
    ("devices-unknown-plugin", ["devices", "--plugin", "tpu"], 2, "--plugin"),
    (
        "devices-missing-sysfs",
        ["devices", "--plugin", "rdma", "--sysfs-root", "{missing}"],
        2,
        "--sysfs-root",
    ),
    ("devices-missing-topology", ["devices", "--plugin", "sim", "--topology", "{missing}"], 2, "{missing}"),
    ("devices-malformed-topology", ["devices", "--plugin", "sim", "--topology", "{badjson}"], 2, "{badjson}"),
    ("devices-wrong-size-topology", ["devices", "--plugin", "sim", "--topology", "{skewed}"], 2, "{skewed}"),
    (
        "devices-topology-wrong-type",
        ["devices", "--plugin", "sim", "--topology", "{topo-type}"],
        2,
        "{topo-type}",
    ),
    (
        "devices-topology-negative",
        ["devices", "--plugin", "sim", "--topology", "{topo-neg}"],
        2,
        "{topo-neg}",
    ),
    (
        "devices-topology-not-object",
        ["devices", "--plugin", "sim", "--topology", "{listyaml}"],
        2,
        "{listyaml}",
    ),
    (
        "devices-topology-nested",
        ["devices", "--plugin", "sim", "--topology", "{topo-deep}"],
        2,
        "{topo-deep}",
    ),
    (
        "devices-topology-infinite",
        ["devices", "--plugin", "sim", "--topology", "{topo-inf}"],
        2,
        "{topo-inf}",
    ),
    ("devices-topology-binary", ["devices", "--plugin", "sim", "--topology", "{binary}"], 2, "{binary}"),
    # ---- scheduler
    # ---- extender
    ("extender-unknown-policy", ["extender", "--policy", "fastest"], 2, "--policy"),
    ("extender-malformed-address", ["extender", "--address", "8888"], 2, "--address"),
    ("extender-bad-name", ["extender", "--scheduler-name", "My Scheduler"], 2, "--scheduler-name"),
    (
        "extender-tls-half",
        ["extender", "--tls-cert-file", "{badyaml}"],
        2,
        "--tls-private-key-file",
    ),
    ("extender-missing-keys", ["extender", "--keys-dir", "{missing}"], 2, "--keys-dir"),
    ("extender-malformed-config", ["extender", "--config", "{badyaml}"], 2, "{badyaml}"),
    ("crishim-nri-without-devices", ["crishim", "--front", "nri"], 2, "--device-plugin"),
    (
        "crishim-nri-bad-index",
        ["crishim", "--front", "nri", "--nri-plugin-index", "7"],
        2,
        "--nri-plugin-index",
    ),
    (
        "crishim-nri-bad-socket",
        ["crishim", "--front", "nri", "--nri-socket", "relative.sock"],
        2,
        "--nri-socket",
    ),
    ("scheduler-unknown-policy", ["scheduler", "--policy", "fastest"], 2, "--policy"),
    ("scheduler-malformed-address", ["scheduler", "--metrics-address", "9464"], 2, "--metrics-address"),
    ("scheduler-bad-name", ["scheduler", "--scheduler-name", "My Scheduler"], 2, "--scheduler-name"),
    ("scheduler-missing-keys", ["scheduler", "--keys-dir", "{missing}"], 2, "--keys-dir"),
    (
        "scheduler-no-signing-key",
        ["scheduler", "--keys-dir", "{keys}", "--signing-key-id", "k9", "--kubeconfig", "{closed}"],
        2,
        "k9",
    ),
    ("scheduler-missing-config", ["scheduler", "--config", "{missing}"], 2, "--config"),
    ("scheduler-unreadable-config", ["scheduler", "--config", "{dir}"], 2, "--config"),
    ("scheduler-malformed-config", ["scheduler", "--config", "{badyaml}"], 2, "{badyaml}"),
    ("scheduler-config-not-mapping", ["scheduler", "--config", "{listyaml}"], 2, "{listyaml}"),
    ("scheduler-config-negative", ["scheduler", "--config", "{cfg-negative}"], 2, "heartbeatStaleSeconds"),
    ("scheduler-config-zero-workers", ["scheduler", "--config", "{cfg-workers}"], 2, "bindWorkers"),
    ("scheduler-config-policy", ["scheduler", "--config", "{cfg-policy}"], 2, "policy"),
    ("scheduler-config-address", ["scheduler", "--config", "{cfg-address}"], 2, "metricsAddress"),
    ("scheduler-config-lease", ["scheduler", "--config", "{cfg-lease}"], 2, "leaderElection"),
    ("scheduler-config-unknown-key", ["scheduler", "--config", "{cfg-unknown}"], 2, "bindWorker"),
    ("scheduler-missing-kubeconfig", ["scheduler", "--kubeconfig", "{missing}"], 2, "--kubeconfig"),
    (
        "scheduler-malformed-kubeconfig",
        ["scheduler", "--keys-dir", "{keys}", "--kubeconfig", "{badyaml}"],
        2,
        "--kubeconfig",
    ),
    (
        "scheduler-kubeconfig-bad-server",
        ["scheduler", "--keys-dir", "{keys}", "--kubeconfig", "{badserver}"],
        2,
        "--kubeconfig",
    ),
    (
        "scheduler-kubeconfig-missing-ca",
        ["scheduler", "--keys-dir", "{keys}", "--kubeconfig", "{badca}"],
        2,
        "--kubeconfig",
    ),
    ("scheduler-no-api", ["scheduler", "--keys-dir", "{keys}"], 2, "--kubeconfig"),
    (
        "scheduler-unreachable",
        ["scheduler", "--keys-dir", "{keys}", "--kubeconfig", "{closed}"],
        1,
        "cannot reach",
    ),
    (
        "scheduler-unresolvable",
        ["scheduler", "--keys-dir", "{keys}", "--kubeconfig", "{unresolvable}"],
        1,
        "cannot reach",
    ),
    # ---- simulate
    ("simulate-unknown-policy", ["simulate", "--policy", "fastest"], 2, "fastest"),
    ("simulate-negative-inflation", ["simulate", "--inflation", "-1"], 2, "--inflation"),
    ("simulate-absurd-inflation", ["simulate", "--inflation", "1e9"], 2, "--inflation"),
    ("simulate-negative-seed", ["simulate", "--seed", "-3"], 2, "--seed"),
    ("simulate-malformed-seeds", ["simulate", "--seeds", "a-b"], 2, "--seeds"),
    ("simulate-absurd-seeds", ["simulate", "--seeds", "0-99999999999"], 2, "--seeds"),
    ("simulate-half-trace", ["simulate", "--nodes", "{nodes}"], 2, "--pods"),
    ("simulate-missing-trace", ["simulate", "--nodes", "{missing}", "--pods", "{missing}"], 2, "--nodes"),
    ("simulate-unreadable-trace", ["simulate", "--nodes", "{dir}", "--pods", "{dir}"], 2, "--nodes"),
    ("simulate-malformed-trace", ["simulate", "--nodes", "{badjson}", "--pods", "{badjson}"], 2, "{badjson}"),
    (
        "simulate-unwritable-plot",
        ["simulate", "--seed", "42", "--plot", "{missing}/curve.png"],
        2,
        "{missing}",
    ),
    # ---- node install / uninstall / check
    ("node-no-action", ["node"], 2, "ACTION"),
    ("node-install-missing-root", ["node", "install", "--root", "{missing}"], 2, "{missing}"),
    (
        "node-install-tcp-endpoint",
        ["node", "install", "--containerd-socket", "tcp://x:1"],
        2,
        "--containerd-socket",
    ),
    ("node-install-bad-address", ["node", "install", "--metrics-address", "all"], 2, "--metrics-address"),
    ("node-install-relative-listen", ["node", "install", "--listen", "shim.sock"], 2, "--listen"),
    ("node-install-unknown-plugin", ["node", "install", "--device-plugin", "tpu"], 2, "--device-plugin"),
    ("node-install-bad-node-name", ["node", "install", "--node-name", "GPU_7"], 2, "--node-name"),
    (
        "node-install-no-containerd",
        ["node", "install", "--root", "{dir}", "--containerd-socket", "{missing}"],
        2,
        "{missing}",
    ),
    (
        "node-install-not-a-socket",
        ["node", "install", "--root", "{dir}", "--containerd-socket", "{file}"],
        2,
        "{file}",
    ),
    (
        "node-install-missing-key",
        ["node", "install", "--root", "{dir}", "--key-file", "{missing}"],
        2,
        "{missing}",
    ),
    (
        "node-install-unreadable-key",
        ["node", "install", "--root", "{dir}", "--key-file", "{dir}"],
        2,
        "{dir}",
    ),
    (
        "node-install-malformed-key",
        ["node", "install", "--root", "{dir}", "--key-file", "{badjson}"],
        2,
        "neither PEM nor base64",
    ),
    (
        "node-install-private-key",
        ["node", "install", "--root", "{dir}", "--key-file", "{key}"],
        2,
        "private key",
    ),
    ("node-uninstall-missing-root", ["node", "uninstall", "--root", "{missing}"], 2, "{missing}"),
    (
        "node-uninstall-malformed-record",
        ["node", "uninstall", "--root", "{bad-record}"],
        1,
        "node-install.json",
    ),
    ("node-check-missing-root", ["node", "check", "--root", "{missing}"], 2, "{missing}"),
    ("node-check-bad-pid", ["node", "check", "--kubelet-pid", "-5"], 2, "--kubelet-pid"),
    ("node-check-malformed-record", ["node", "check", "--root", "{bad-record}"], 1, "node-install.json"),
    # ---- keys
    ("keys-no-action", ["keys"], 2, "ACTION"),
    ("keys-public-missing", ["keys", "public", "{missing}"], 2, "{missing}"),
    ("keys-public-unreadable", ["keys", "public", "{dir}"], 2, "{dir}"),
    ("keys-public-malformed", ["keys", "public", "{badjson}"], 2, "{badjson}"),
    ("keys-public-bad-format", ["keys", "public", "--format", "der", "{key}"], 2, "--format"),
    ("keys-check-missing", ["keys", "check", "{missing}"], 2, "{missing}"),
    ("keys-check-file", ["keys", "check", "{file}"], 2, "{file}"),
    ("keys-generate-exists", ["keys", "generate", "--out", "{key}"], 2, "{key}"),
    ("keys-generate-no-dir", ["keys", "generate", "--out", "{missing}/k1"], 2, "{missing}"),
    # ---- files that are not files: /dev/zero (through a symlink), a FIFO, a runaway size, a directory
    ("scheduler-config-zero", ["scheduler", "--config", "{zero}"], 2, "{zero}"),
    ("scheduler-kubeconfig-zero", ["scheduler", "--kubeconfig", "{zero}"], 2, "--kubeconfig"),
    ("devices-topology-zero", ["devices", "--plugin", "sim", "--topology", "{zero}"], 2, "{zero}"),
    ("crishim-topology-zero", ["crishim", "{shim}", "--sim-topology", "{zero}"], 2, "{zero}"),
    ("advertise-kubeconfig-zero", ["advertise", "{dev-ok}", "--kubeconfig", "{zero}"], 2, "--kubeconfig"),
    ("keys-public-zero", ["keys", "public", "{zero}"], 2, "{zero}"),
    ("node-install-key-zero", ["node", "install", "--root", "{dir}", "--key-file", "{zero}"], 2, "{zero}"),
    ("scheduler-config-fifo", ["scheduler", "--config", "{fifo}"], 2, "{fifo}"),
    ("scheduler-kubeconfig-fifo", ["scheduler", "--kubeconfig", "{fifo}"], 2, "--kubeconfig"),
    ("devices-topology-fifo", ["devices", "--plugin", "sim", "--topology", "{fifo}"], 2, "{fifo}"),
    ("crishim-topology-fifo", ["crishim", "{shim}", "--sim-topology", "{fifo}"], 2, "{fifo}"),
    ("advertise-kubeconfig-fifo", ["advertise", "{dev-ok}", "--kubeconfig", "{fifo}"], 2, "--kubeconfig"),
    ("keys-public-fifo", ["keys", "public", "{fifo}"], 2, "{fifo}"),
    ("node-install-key-fifo", ["node", "install", "--root", "{dir}", "--key-file", "{fifo}"], 2, "{fifo}"),
    ("scheduler-config-huge", ["scheduler", "--config", "{huge}"], 2, "{huge}"),
    ("scheduler-kubeconfig-huge", ["scheduler", "--kubeconfig", "{huge}"], 2, "--kubeconfig"),
    ("devices-topology-huge", ["devices", "--plugin", "sim", "--topology", "{huge}"], 2, "{huge}"),
    ("crishim-topology-huge", ["crishim", "{shim}", "--sim-topology", "{huge}"], 2, "{huge}"),
    ("advertise-kubeconfig-huge", ["advertise", "{dev-ok}", "--kubeconfig", "{huge}"], 2, "--kubeconfig"),
    ("keys-public-huge", ["keys", "public", "{huge}"], 2, "{huge}"),
    ("node-install-key-huge", ["node", "install", "--root", "{dir}", "--key-file", "{huge}"], 2, "{huge}"),
    ("scheduler-config-dir", ["scheduler", "--config", "{dir}"], 2, "{dir}"),
    ("scheduler-kubeconfig-dir", ["scheduler", "--kubeconfig", "{dir}"], 2, "--kubeconfig"),
    ("devices-topology-dir", ["devices", "--plugin", "sim", "--topology", "{dir}"], 2, "{dir}"),
    ("crishim-topology-dir", ["crishim", "{shim}", "--sim-topology", "{dir}"], 2, "{dir}"),
    ("advertise-kubeconfig-dir", ["advertise", "{dev-ok}", "--kubeconfig", "{dir}"], 2, "--kubeconfig"),
    ("keys-public-dir", ["keys", "public", "{dir}"], 2, "{dir}"),
    ("node-install-key-dir", ["node", "install", "--root", "{dir}", "--key-file", "{dir}"], 2, "{dir}"),
    ("simulate-trace-zero", ["simulate", "--nodes", "{zero}", "--pods", "{zero}"], 2, "{zero}"),
    ("simulate-trace-fifo", ["simulate", "--nodes", "{fifo}", "--pods", "{fifo}"], 2, "{fifo}"),
    (
        "simulate-trace-hugetrace",
        ["simulate", "--nodes", "{hugetrace}", "--pods", "{hugetrace}"],
        2,
        "{hugetrace}",
    ),
    ("simulate-trace-binary", ["simulate", "--nodes", "{binary}", "--pods", "{binary}"], 2, "{binary}"),
    (
        "scheduler-kubeconfig-token-device",
        ["scheduler", "--keys-dir", "{keys}", "--kubeconfig", "{token-zero}"],
        2,
        "tokenFile zero",
    ),
    (
        "scheduler-kubeconfig-token-nul",
        ["scheduler", "--keys-dir", "{keys}", "--kubeconfig", "{token-nul}"],
        2,
        "not a file name",
    ),
    (
        "advertise-kubeconfig-ca-fifo",
        ["advertise", "{dev-ok}", "--kubeconfig", "{ca-fifo}"],
        2,
        "certificate-authority",
    ),
    ("crishim-sim-state-dir-file", ["crishim", "--sim-state-dir", "{file}"], 2, "--sim-state-dir"),
    ("crishim-mps-dir-device", ["crishim", "--mps-dir", "{zero}"], 2, "--mps-dir"),
    ("devices-state-dir-device", ["devices", "--plugin", "sim", "--state-dir", "{zero}"], 2, "--state-dir"),
    ("simulate-plot-directory", ["simulate", "--seed", "1", "--plot", "{dir}"], 2, "--plot"),
    ("crishim-keys-dir-file", ["crishim", "--allocation-keys-dir", "{file}"], 2, "--allocation-keys-dir"),
    ("crishim-keys-dir-device", ["crishim", "--allocation-keys-dir", "{zero}"], 2, "--allocation-keys-dir"),
    ("scheduler-keys-dir-device", ["scheduler", "--keys-dir", "{zero}"], 2, "--keys-dir"),
    ("scheduler-config-binary", ["scheduler", "--config", "{binary}"], 2, "{binary}"),
    ("keys-public-binary", ["keys", "public", "{binary}"], 2, "{binary}"),
    # ---- up / down (parse-time refusals only: nothing here may start a cluster)
    ("up-unknown-containerd", ["up", "--containerd", "3"], 2, "--containerd"),
    ("up-state-dir-file", ["up", "--state-dir", "{file}", "--no-workload"], 2, "--state-dir"),
    ("up-state-dir-device", ["up", "--state-dir", "/dev/zero", "--no-workload"], 2, "--state-dir"),
    ("up-state-dir-empty", ["up", "--state-dir", "", "--no-workload"], 2, "--state-dir"),
    ("up-state-dir-under-file", ["up", "--state-dir", "{file}/x", "--no-workload"], 2, "--state-dir"),
    ("down-state-dir-file", ["down", "--state-dir", "{file}"], 2, "--state-dir"),
    ("down-state-dir-empty", ["down", "--state-dir", ""], 2, "--state-dir"),
    ("down-no-cluster", ["down", "--state-dir", "{missing}"], 2, "{missing}"),
    ("down-unknown-flag", ["down", "--force"], 2, "--force"),
    ("scheduler-unknown-flag", ["scheduler", "--bogus", "x"], 2, "--bogus"),
    ("node-install-unknown-flag", ["node", "install", "--force"], 2, "--force"),
    ("keys-generate-unknown-flag", ["keys", "generate", "--zz"], 2, "--zz"),
]


def _kubeconfig(
    server: str, extra_cluster: dict[str, str] | None = None, user: dict[str, str] | None = None
) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "x", "user": "u"}}],
            "clusters": [{"name": "x", "cluster": {"server": server, **(extra_cluster or {})}}],
            "users": [{"name": "u", "user": user or {"token": "not-a-real-token"}}],
        }
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Paths of good and bad inputs, by placeholder name; a busy port held for the module."""
    root = tmp_path_factory.mktemp("cli-inputs")
    files = {
        "badyaml": ("bad.yaml", "garbage: [\n"),
        "listyaml": ("list.yaml", "- a\n- b\n"),
        "badjson": ("bad.json", "{\n"),
        "skewed": (
            "skewed.json",
            '{"gpus": [{"index": 0, "model": "V100", "memoryMiB": 16000}, '
            '{"index": 1, "model": "V100", "memoryMiB": 16000}], "nvlink": [[0]], "pcie": [["X"]]}',
        ),
        "topo-type": ("type.json", '{"gpus": [{"index": 0, "memoryMiB": "lots"}]}'),
        "topo-neg": ("negative.json", '{"gpus": [{"index": 0, "memoryMiB": -16000}]}'),
        "topo-deep": ("deep.json", "[" * 100_000 + "]" * 100_000),
        "topo-inf": ("inf.json", '{"gpus": [{"index": 0, "memoryMiB": 1e400}]}'),
        "nodes": ("nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1000,1,V100\n"),
        "file": ("plain.txt", "not a socket\n"),
        "closed": ("closed.kubeconfig", _kubeconfig(f"https://127.0.0.1:{_closed_port()}")),
        "unresolvable": ("dns.kubeconfig", _kubeconfig("https://no-such-host.invalid:6443")),
        "badserver": ("server.kubeconfig", _kubeconfig("not a url")),
        "noserver": ("noserver.kubeconfig", _kubeconfig("")),
        "badca": (
            "ca.kubeconfig",
            _kubeconfig("https://127.0.0.1:1", {"certificate-authority": "/nonexistent"}),
        ),
        "token-zero": ("token.kubeconfig", _kubeconfig("https://127.0.0.1:1", user={"tokenFile": "zero"})),
        "token-nul": ("nul.kubeconfig", _kubeconfig("https://127.0.0.1:1", user={"tokenFile": "a\0b"})),
        "ca-fifo": (
            "ca-fifo.kubeconfig",
            _kubeconfig("https://127.0.0.1:1", {"certificate-authority": str(root / "fifo")}),
        ),
        "cfg-negative": ("negative.yaml", "heartbeatStaleSeconds: -5\n"),
        "cfg-workers": ("workers.yaml", "bindWorkers: 0\n"),
        "cfg-policy": ("policy.yaml", "policy: fastest\n"),
        "cfg-address": ("address.yaml", "metricsAddress: everywhere\n"),
        "cfg-lease": ("lease.yaml", "leaderElection: {leaseSeconds: 5, renewDeadlineSeconds: 10}\n"),
        "cfg-unknown": ("unknown.yaml", "bindWorker: 3\n"),
    }
    paths = {}
    for name, (file_name, text) in files.items():
        (root / file_name).write_text(text)
        paths[name] = str(root / file_name)
    (root / "dir").mkdir()
    (root / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (root / "zero").symlink_to("/dev/zero")
    os.mkfifo(root / "fifo")  # nothing ever writes it: opening it to read would block forever
    with (root / "huge").open("wb") as huge:  # sparse: costs no disk
        huge.truncate(MAX_INPUT_BYTES + 1)
    with (root / "hugetrace.csv").open("wb") as huge:
        huge.truncate(MAX_TRACE_BYTES + 1)
    record = root / "bad-record" / "etc" / "kubegpu"
    record.mkdir(parents=True)
    (record / "node-install.json").write_text("{")
    keys = root / "keys"
    keys.mkdir()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    (keys / "k1").write_bytes(private_key_pem(Ed25519PrivateKey.generate()))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    sim = [
        "--listen",
        str(root / "shim.sock"),
        "--device-plugin",
        "sim",
        "--node-name",
        "n1",
        "--sim-state-dir",
        str(root / "sim"),
    ]
    paths |= {
        "missing": str(root / "missing"),
        "dir": str(root / "dir"),
        "binary": str(root / "binary.json"),
        "zero": str(root / "zero"),
        "fifo": str(root / "fifo"),
        "huge": str(root / "huge"),
        "hugetrace": str(root / "hugetrace.csv"),
        "bad-record": str(root / "bad-record"),
        "keys": str(keys),
        "key": str(keys / "k1"),
        "sock": str(root / "shim.sock"),
        "busy": f"127.0.0.1:{busy.getsockname()[1]}",
    }
    expansions = {
        "shim": sim,
        "shim-ok": [*sim, "--sim-topology", "pcie-4gpu"],
        "dev": sim[2:],
        "dev-ok": [*sim[2:], "--sim-topology", "pcie-4gpu"],
    }
    paths |= {name: "\0".join(argv) for name, argv in expansions.items()}
    yield paths
    busy.close()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def expand(argv: list[str], inputs: dict[str, str]) -> list[str]:
    out: list[str] = []
    for arg in argv:
        out += arg.format_map(inputs).split("\0")
    return out


def kubegpu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        cwd=REPO,
        env=environment | (env or {}),
    )


@pytest.mark.parametrize(("argv", "status", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_a_status(
    inputs: dict[str, str], argv: list[str], status: int, names: str
) -> None:
    args = expand(argv, inputs)
    done = kubegpu(*args)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, f"{args}: stderr is not one line:\n{done.stderr}"
    line = lines[0]
    assert "Traceback" not in line
    assert re.match(r"^kubegpu( [a-z]+)*: \S", line), line
    if args and args[0] in COMMANDS:
        assert line.startswith(f"kubegpu {args[0]}"), line
    assert names.format_map(inputs) in line, f"{args}: {line!r} does not name {names.format_map(inputs)!r}"
    assert done.returncode == status, f"{args}: exit {done.returncode}, want {status}: {line}"
    assert done.stdout == "", done.stdout


COMMANDS = {
    "crishim", "advertise", "devices", "scheduler", "extender", "simulate", "keys", "node", "up", "down"
}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of the CLI (``("node", "install")``, ``("crishim",)`` ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _leaves(child, (*path, name))


def test_every_subcommand_is_swept() -> None:
    from kubegpu.cli import build_parser

    leaves = set(_leaves(build_parser()))
    swept = {tuple(c[1][: len(leaf)]) for c in CASES for leaf in leaves}
    missing = sorted(leaves - swept)
    assert not missing, f"subcommands without a bad-input case: {missing}"
    assert {leaf[0] for leaf in leaves} <= COMMANDS


@pytest.mark.parametrize(
    "argv", [["keys", "public", "-"], ["node", "install", "--root", "{dir}", "--key-file", "-"]]
)
def test_an_endless_standard_input_is_read_bounded(inputs: dict[str, str], argv: list[str]) -> None:
    environment = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    with open("/dev/zero", "rb") as zero:
        done = subprocess.run(
            [sys.executable, "-m", "kubegpu", *expand(argv, inputs)],
            stdin=zero,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            cwd=REPO,
            env=environment,
        )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_a_key_directory_entry_that_is_not_a_file_is_reported(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "k1").symlink_to("/dev/zero")
    os.mkfifo(keys / "k2")
    done = kubegpu("keys", "check", str(keys))
    assert done.returncode == 1, done.stderr
    assert '"k1: not a regular file, skipped"' in done.stdout and '"k2: not a regular file' in done.stdout


def test_debug_log_level_shows_the_traceback(inputs: dict[str, str]) -> None:
    done = kubegpu(
        "--log-level", "debug", "scheduler", "--keys-dir", inputs["keys"], "--kubeconfig", inputs["closed"]
    )
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("kubegpu scheduler: cannot reach the API server")


def test_in_cluster_without_a_token_is_one_line(inputs: dict[str, str]) -> None:
    done = kubegpu(
        "scheduler",
        "--keys-dir",
        inputs["keys"],
        env={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"},
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("kubegpu scheduler: in-cluster service account:"), done.stderr


# ---------------------------------------------------------------------------------------- unit tests


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10", 10.0), ("2.5", 2.5), ("500ms", 0.5), ("3s", 3.0), ("2m", 120.0), ("1h", 3600.0), (" 7 ", 7.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert cliargs.duration()(text) == seconds


@pytest.mark.parametrize("text", ["0", "-1", "-0.5s", "nan", "inf", "1e300", "", "5 days", "1d", "0x10"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cliargs.duration()(text)


def test_zero_duration_only_where_allowed() -> None:
    assert cliargs.duration(allow_zero=True)("0") == 0.0
    with pytest.raises(argparse.ArgumentTypeError, match="more than 0"):
        cliargs.duration()("0")
    with pytest.raises(argparse.ArgumentTypeError, match="at most 60"):
        cliargs.duration(maximum=60)("61")


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("1Ki", 1024), ("512Mi", 512 * 2**20), ("2G", 2 * 10**9), ("1GiB", 2**30)],
)
def test_sizes(text: str, size: int) -> None:
    assert cliargs.size()(text) == size


@pytest.mark.parametrize("text", ["0", "-1Gi", "1.5Gi", "Gi", "12 parsecs", "1Pi"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cliargs.size()(text)


@pytest.mark.parametrize(
    "text", ["127.0.0.1:9464", ":9464", "localhost:0", "[::1]:80", "metrics.example.org:443"]
)
def test_addresses(text: str) -> None:
    assert cliargs.listen_address(text) == text


@pytest.mark.parametrize(
    "text", ["9464", "host", "::1:80", "[::x]:80", "a b:1", "h:-1", "h:65536", "h:", "-h:1"]
)
def test_bad_addresses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cliargs.listen_address(text)


@pytest.mark.parametrize("text", ["unix:///run/x.sock", "unix:/run/x.sock", "/run/x.sock"])
def test_endpoints(text: str) -> None:
    assert cliargs.unix_endpoint(text) == text


@pytest.mark.parametrize(
    "text",
    ["tcp://1.2.3.4:5", "unix://relative", "x.sock", "", "unix:///" + "a" * 110, "/a\0b", "npipe:////./p"],
)
def test_bad_endpoints(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cliargs.unix_endpoint(text)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("n1", True),
        ("gpu-1.dc", True),
        ("N1", False),
        ("a_b", False),
        ("-a", False),
        ("a" * 254, False),
        ("", False),
    ],
)
def test_node_names(text: str, ok: bool) -> None:
    if ok:
        assert cliargs.node_name(text) == text
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            cliargs.node_name(text)


def test_counts_and_numbers() -> None:
    assert cliargs.count(0, 10)("10") == 10
    assert cliargs.count(0, 10)(" 7 ") == 7
    for bad in ["11", "-1", "1.5", "x", "1_0", "+3", "٣", "", " "]:  # underscores, signs, non-ASCII digits
        with pytest.raises(argparse.ArgumentTypeError):
            cliargs.count(0, 10)(bad)
    assert cliargs.number(0, 2)("2") == 2.0
    for bad in ["0", "-1", "2.1", "nan", "inf"]:
        with pytest.raises(argparse.ArgumentTypeError):
            cliargs.number(0, 2)(bad)
    assert cliargs.number(0, 2, inclusive=True)("0") == 0.0


def test_check_listen_names_the_flag() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(cliargs.Failure, match=f"--metrics-address {address}: cannot listen"):
            cliargs.check_listen("--metrics-address", address)
    cliargs.check_listen("--metrics-address", "127.0.0.1:0")


def test_one_line_and_truncation() -> None:
    assert cliargs.one_line("a\n  b\r\n\tc ") == "a b c"
    assert len(cliargs.one_line("x" * 5000)) == cliargs.MAX_MESSAGE


def _boom(error: BaseException) -> int:
    raise error


@pytest.mark.parametrize(
    ("error", "status", "text"),
    [
        (cliargs.UsageError("--flag: bad"), 2, "--flag: bad"),
        (cliargs.Failure("went wrong\nacross lines"), 1, "went wrong across lines"),
        (FileNotFoundError(2, "No such file or directory", "/x/y"), 1, "/x/y: No such file or directory"),
        (PermissionError(13, "Permission denied"), 1, "Permission denied"),
        (RuntimeError("odd"), 1, "unexpected RuntimeError: odd"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_the_boundary(
    capsys: pytest.CaptureFixture[str], error: BaseException, status: int, text: str
) -> None:
    assert cliargs.run_command("kubegpu x", lambda: _boom(error)) == status
    err = capsys.readouterr().err
    assert err == f"kubegpu x: {text}\n" or (err.startswith(f"kubegpu x: {text}") and err.count("\n") == 1)


def test_the_boundary_with_debug_prints_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert cliargs.run_command("kubegpu x", lambda: _boom(RuntimeError("odd")), debug=True) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("kubegpu x: unexpected RuntimeError: odd")


def test_the_boundary_maps_library_errors(capsys: pytest.CaptureFixture[str]) -> None:
    import urllib3
    from kubernetes.client import ApiException
    from kubernetes.config.config_exception import ConfigException

    api = ApiException(status=403, reason="Forbidden")
    api.body = '{"kind":"Status","message":"nodes \\"n1\\" is forbidden: User \\"x\\" cannot patch"}'
    cases = [
        (api, 1, 'the API server answered 403 Forbidden: nodes "n1" is forbidden'),
        (ConfigException("Invalid kube-config file."), 2, "kubeconfig: Invalid kube-config file."),
        (
            urllib3.exceptions.MaxRetryError(None, "/version", OSError("Connection refused")),
            1,
            "cannot reach",
        ),
    ]
    for error, status, text in cases:
        assert cliargs.run_command("kubegpu x", lambda e=error: _boom(e)) == status
        err = capsys.readouterr().err
        assert err.startswith(f"kubegpu x: {text}") and err.count("\n") == 1, err


def test_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    reader, writer = os.pipe()
    os.close(reader)
    done = subprocess.run(
        [sys.executable, "-m", "kubegpu", "simulate", "--list-policies"],
        stdout=writer,
        stderr=subprocess.PIPE,
        text=True,
        timeout=RUN_TIMEOUT,
        cwd=REPO,
    )
    os.close(writer)
    assert "Traceback" not in done.stderr and done.returncode == 1, done.stderr


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"heartbeat_stale_seconds": 0.0}, "heartbeatStaleSeconds"),
        ({"backoff_initial_seconds": float("nan")}, "backoffInitialSeconds"),
        ({"backoff_max_seconds": 1e12}, "backoffMaxSeconds"),
        ({"backoff_initial_seconds": 20.0}, "backoffInitialSeconds must not exceed"),
        ({"bind_workers": 0}, "bindWorkers"),
        ({"bind_workers": 100000}, "bindWorkers"),
        ({"scheduler_name": "Kube GPU"}, "schedulerName"),
        ({"gpu_resource": "gpu"}, "gpuResource"),
        ({"signing_key_id": "../k1"}, "signingKeyId"),
        ({"policy": "nope"}, "policy"),
        ({"metrics_address": "x"}, "metricsAddress"),
        ({"keys_dir": ""}, "keysDir"),
    ],
)
def test_config_values_are_validated(change: dict[str, object], key: str) -> None:
    validate(SchedulerConfig())
    config = SchedulerConfig(**change)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=key):
        validate(config)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"lease_seconds": -1.0}, "leaderElection.leaseSeconds"),
        ({"renew_deadline_seconds": 20.0}, "leaseSeconds > renewDeadlineSeconds"),
        ({"retry_period_seconds": 9.0}, "1.2 x retryPeriodSeconds"),
        ({"namespace": "a.b"}, "leaderElection.namespace"),
        ({"lease_name": "Lease!"}, "leaderElection.leaseName"),
    ],
)
def test_leader_election_values_are_validated(change: dict[str, object], key: str) -> None:
    config = SchedulerConfig()
    for name, value in change.items():
        setattr(config.leader_election, name, value)
    with pytest.raises(ConfigError, match=key):
        validate(config)


def test_metrics_listen_on_ipv6_loopback() -> None:
    import urllib.request

    from kubegpu.httpserve import MetricsServer

    server = MetricsServer("[::1]:0", lambda: b"", {"/healthz": lambda: (True, "ok")})
    server.start()
    try:
        assert urllib.request.urlopen(f"http://[::1]:{server.port}/healthz", timeout=5).read() == b"ok\n"
    finally:
        server.stop()


def test_a_shim_that_fails_to_start_takes_down_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    import crishim.server as server

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(server, "MetricsServer", refuse)
    config = server.ShimConfig(
        listen=f"unix://{tmp_path}/shim.sock",
        runtime_endpoint=f"unix://{tmp_path}/runtime.sock",
        metrics_address="127.0.0.1:0",
    )
    with pytest.raises(OSError, match="in use"):
        asyncio.run(server.serve(config))
    assert not (tmp_path / "shim.sock").exists()


def test_input_files_are_regular_bounded_and_never_block(tmp_path: Path) -> None:
    from kubegpu import inputfiles

    good = tmp_path / "good"
    good.write_bytes(b"x" * 10)
    link = tmp_path / "link"
    link.symlink_to(good)
    assert inputfiles.check_input(link, 10) == link and inputfiles.read_input(link, 10) == b"x" * 10
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for name, words in [
        ("fifo", "FIFO"),
        ("zero", "device"),
        ("missing", "No such file"),
        ("loop", "symbolic links"),
        ("", "directory"),
    ]:
        for call in (inputfiles.check_input, inputfiles.read_input):
            with pytest.raises(inputfiles.InputFileError) as caught:
                call(tmp_path / name, 100)
            assert words in str(caught.value) and str(tmp_path / name) in str(caught.value)
    with pytest.raises(inputfiles.InputFileError, match="too large"):
        inputfiles.read_input(good, 9)
    with open("/dev/zero", "rb") as zero, pytest.raises(inputfiles.InputFileError, match="more than 5"):
        inputfiles.read_bounded(zero, 5)
