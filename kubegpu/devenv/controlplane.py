"""Run a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler) on loopback.

For tests, benchmarks and demos. The binaries are built from Go modules by
``tests/cluster/build.sh`` (``make testbin``) into a per-user, per-version cache;
:func:`testbin_dir` computes the same directory. Every run gets its own directory holding a
fresh CA, serving and client certificates (made with the ``openssl`` CLI), the
service-account signing key, an admin kubeconfig, the etcd data and one log file per process.
All ports are free loopback ports; nothing listens on another address.

Typical use::

    with ControlPlane() as cp:
        core = kubernetes.client.CoreV1Api(cp.admin_client())
        sched = cp.start_scheduler({"profiles": [{"schedulerName": "default-scheduler"}]})

``stop()`` terminates every process group it started (SIGTERM, then SIGKILL after a timeout),
so no process outlives the control plane; an ``atexit`` hook does the same for a forgotten one.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.config import new_client_from_config

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO_ROOT / "tests" / "cluster"
LOOPBACK = "127.0.0.1"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
ADMIN_USER = "kubegpu-admin"
SCHEDULER_USER = "system:kube-scheduler"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
KUBELET_CLIENT = "apiserver-kubelet-client"
SCHEDULER_API_VERSION = "kubescheduler.config.k8s.io/v1"
MERGE_PATCH = "application/merge-patch+json"
PORT_ATTEMPTS = 3
EC_CURVE = "ec_paramgen_curve:prime256v1"
NEW_EC_KEY = ("-newkey", "ec", "-pkeyopt", EC_CURVE, "-nodes")


class ControlPlaneError(RuntimeError):
    """A control plane component could not be found, started or driven."""


class BinariesMissing(ControlPlaneError):
    """The kube-apiserver, kube-scheduler or etcd binary is not in the testbin cache."""


# --------------------------------------------------------------------------- binaries


# kube-apiserver flags that serve Kubernetes' own PodGroup API (scheduling.k8s.io/v1beta1, beta in
# v1.37 behind the GenericWorkload gate, off by default): gang scheduling (docs/gang.md).
POD_GROUP_API_ARGS = (
    "--runtime-config=scheduling.k8s.io/v1beta1=true",
    "--feature-gates=GenericWorkload=true",
)


def pinned_version(go_mod: Path, module: str) -> str:
    """Version that ``go_mod`` requires for ``module`` (single-line or block ``require``)."""
    pattern = rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)"
    match = re.search(pattern, go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise ControlPlaneError(f"{go_mod} does not require {module}")
    return match.group(1)


def pinned_versions(cluster_dir: Path = CLUSTER_DIR) -> tuple[str, str]:
    """(Kubernetes version, etcd version) pinned by tests/cluster/go.mod and etcd/go.mod."""
    try:
        k8s_version = pinned_version(cluster_dir / "go.mod", "k8s.io/kubernetes")
        etcd_version = pinned_version(cluster_dir / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3")
    except OSError as exc:
        raise BinariesMissing(f"cannot read the version pins under {cluster_dir}: {exc}") from exc
    return k8s_version, etcd_version


def testbin_root() -> Path:
    """Cache root: $KUBEGPU_TESTBIN, else $XDG_CACHE_HOME/kubegpu/testbin (~/.cache default)."""
    if os.environ.get("KUBEGPU_TESTBIN"):
        return Path(os.environ["KUBEGPU_TESTBIN"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kubegpu" / "testbin"


def testbin_dir(cluster_dir: Path = CLUSTER_DIR) -> Path:
    """Directory holding the binaries for the pinned versions (same logic as build.sh)."""
    k8s_version, etcd_version = pinned_versions(cluster_dir)
    return testbin_root() / f"{k8s_version}-{etcd_version}"


@dataclass(frozen=True)
class Binaries:
    """Paths of the three control plane executables."""

    apiserver: Path
    scheduler: Path
    etcd: Path


def find_binaries(directory: Path | None = None) -> Binaries:
    """The binaries in ``directory`` (default :func:`testbin_dir`), or raise BinariesMissing."""
    directory = directory or testbin_dir()
    found = Binaries(
        apiserver=directory / "kube-apiserver",
        scheduler=directory / "kube-scheduler",
        etcd=directory / "etcd",
    )
    missing = [p.name for p in vars(found).values() if not os.access(p, os.X_OK)]
    if missing:
        raise BinariesMissing(
            f"{', '.join(missing)} not found in {directory}; run `make testbin` "
            "(tests/cluster/build.sh) to build them"
        )
    return found


# --------------------------------------------------------------------------- helpers


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held together while picking)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tail(path: Path, lines: int) -> str:
    """Last ``lines`` lines of a text file, or a note when it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({path} unreadable: {exc})"


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {args[0]} failed: {result.stderr.strip()}")


# --------------------------------------------------------------------------- PKI


@dataclass(frozen=True)
class Pki:
    """The per-run certificates and keys (EC P-256), all files in ``directory``."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "service-account.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.directory / "service-account.pub"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def create(self) -> Pki:
        """Write the CA, the apiserver serving cert and the service-account signing key."""
        self.directory.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", *NEW_EC_KEY, "-keyout", str(self.ca_key),
                 "-out", str(self.ca_cert), "-days", "7", "-subj", "/CN=kubegpu-test-ca")
        self.issue("apiserver", "/CN=kube-apiserver", server=True)
        # kubeadm gives this identity cluster-admin rights; system:masters does the same here.
        self.issue(KUBELET_CLIENT, "/CN=kube-apiserver-kubelet-client/O=system:masters")
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", EC_CURVE,
                 "-out", str(self.service_account_key))
        # The apiserver reads public keys (or RSA/EC, not PKCS#8, private keys) from
        # --service-account-key-file.
        _openssl("pkey", "-in", str(self.service_account_key), "-pubout",
                 "-out", str(self.service_account_public_key))
        return self

    def issue(
        self, name: str, subject: str, server: bool = False, alt_names: Sequence[str] = ()
    ) -> tuple[Path, Path]:
        """Issue a CA-signed cert ``name`` for ``subject``: serving or client.

        A serving cert names loopback (``IP:127.0.0.1``, ``DNS:localhost``) and ``alt_names``
        (each ``IP:...`` or ``DNS:...``).
        """
        ext = self.directory / f"{name}.ext"
        usage = "serverAuth" if server else "clientAuth"
        lines = [
            "basicConstraints=critical,CA:FALSE",
            f"extendedKeyUsage={usage}",
            "keyUsage=critical,digitalSignature,keyEncipherment",
        ]
        if server:
            lines.append("subjectAltName=" + ",".join([f"IP:{LOOPBACK}", "DNS:localhost", *alt_names]))
        ext.write_text("\n".join(lines) + "\n")
        csr = self.directory / f"{name}.csr"
        _openssl("req", "-new", *NEW_EC_KEY, "-keyout", str(self.key(name)),
                 "-out", str(csr), "-subj", subject)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert),
                 "-CAkey", str(self.ca_key), "-CAcreateserial", "-days", "7",
                 "-extfile", str(ext), "-out", str(self.cert(name)))
        return self.cert(name), self.key(name)


def kubeconfig(
    server: str, ca_cert: Path, user: str, credentials: Mapping[str, str]
) -> dict[str, Any]:
    """A single-context kubeconfig dict; ``credentials`` is the kubeconfig ``user`` entry. The CA
    (and a client certificate and key) are named by path, not embedded: the Python Kubernetes
    client copies embedded ones to temporary files that only its exit handler removes, so every
    process killed without one (SIGKILL, multiprocessing workers) left them in /tmp."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kubegpu-test",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            },
        ],
        "users": [{"name": user, "user": dict(credentials)}],
        "contexts": [{"name": user, "context": {"cluster": "kubegpu-test", "user": user}}],
        "current-context": user,
    }


def scheduler_config(
    config: str | Mapping[str, Any] | None, kubeconfig_path: Path, leader_elect: bool
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration dict from yaml text or a dict, wired to our kubeconfig.

    ``apiVersion``/``kind`` default to v1; ``clientConnection.kubeconfig`` is always set to
    ``kubeconfig_path``; ``leaderElection.leaderElect`` is set from ``leader_elect`` unless the
    given config sets it.
    """
    loaded = yaml.safe_load(config) if isinstance(config, str) else config
    result: dict[str, Any] = json.loads(json.dumps(dict(loaded or {})))  # deep copy
    result.setdefault("apiVersion", SCHEDULER_API_VERSION)
    result.setdefault("kind", "KubeSchedulerConfiguration")
    result.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig_path)
    result.setdefault("leaderElection", {}).setdefault("leaderElect", leader_elect)
    return result


# --------------------------------------------------------------------------- processes


@dataclass
class Component:
    """One started process, in its own process group, logging to ``log_path``."""

    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # set by stop(); a dead process that is not stopped has crashed

    def start(self) -> Component:
        with self.log_path.open("ab") as log:
            log.write(f"# {' '.join(self.args)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 50) -> str:
        return tail(self.log_path, lines)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout``, reap the process.

        Idempotent: a second call does not signal a process group id that may be reused.
        """
        if self.process is None or self.stopped:
            return
        self.stopped = True
        self._signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        # Anything left in the group (children of the process) goes too.
        self._signal_group(signal.SIGKILL)
        self.process.wait(timeout=timeout)

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def wait_until(self, probe: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll ``probe()`` until true; raise with the log tail on exit or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                tail = self.tail()
                cause = known_cause(tail)
                raise ControlPlaneError(f"{self.name} exited early{': ' + cause if cause else ''}:\n{tail}")
            if probe():
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"{self.name} not {what} after {timeout}s:\n{self.tail()}")


def known_cause(log: str) -> str | None:
    """A one-line explanation of a daemon's early exit whose log shows a known host limit."""
    if "too many open files" in log and ("inotify" in log or "fsnotify" in log):
        try:
            limit = Path("/proc/sys/fs/inotify/max_user_instances").read_text().strip()
        except OSError:
            limit = "?"
        return (
            f"the host's inotify instances are used up (fs.inotify.max_user_instances={limit}; "
            "other kubelets or containerds on this host hold them): raise it with "
            "`sysctl -w fs.inotify.max_user_instances=1024`"
        )
    return None


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """True when GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException):  # URLError is an OSError
        return False


# --------------------------------------------------------------------------- control plane


class ControlPlane:
    """etcd + kube-apiserver (+ any number of kube-schedulers) in one run directory.

    ``run_dir`` defaults to a new temp dir that ``stop()`` deletes; a given ``run_dir`` is
    kept (logs, certificates, kubeconfigs) except the etcd data. Use as a context manager or
    call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        run_dir: Path | None = None,
        binaries: Binaries | None = None,
        startup_timeout: float = 120.0,
        authorization_mode: str = "Node,RBAC",
        apiserver_extra_args: Sequence[str] = (),
    ) -> None:
        self.binaries = binaries or find_binaries()
        self._owns_run_dir = run_dir is None
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="kubegpu-cp-"))
        self.startup_timeout = startup_timeout
        self.authorization_mode = authorization_mode
        self.apiserver_extra_args = list(apiserver_extra_args)
        self.pki = Pki(self.run_dir / "pki")
        self.components: list[Component] = []
        self.url = ""
        self.etcd_url = ""
        self._scheduler_count = 0

    # ---- lifecycle

    def start(self) -> ControlPlane:
        """Create the PKI, start etcd and kube-apiserver, wait for /readyz, write kubeconfigs."""
        atexit.register(self.stop)
        try:
            self.pki.create()
            self._start_etcd()
            self._start_apiserver()
            self._write_admin_kubeconfig()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every process (newest first), delete etcd data and an owned run dir."""
        for component in reversed(self.components):
            component.stop(timeout)
        shutil.rmtree(self.run_dir / "etcd-data", ignore_errors=True)
        if self._owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- etcd and apiserver

    def _launch(self, name: str, args: list[str]) -> Component:
        component = Component(name, args, self.run_dir / f"{name}.log").start()
        self.components.append(component)
        return component

    def _start_on_free_ports(
        self,
        name: str,
        count: int,
        args_for: Callable[[list[int]], list[str]],
        ready_for: Callable[[list[int]], Callable[[], bool]],
        timeout: float,
    ) -> tuple[Component, list[int]]:
        """Start ``name`` on ``count`` free loopback ports and wait until ``ready_for(ports)``.

        A port picked as free can be taken by someone else before the process binds it; such
        a start is retried on new ports.
        """
        for attempt in range(1, PORT_ATTEMPTS + 1):
            ports = free_ports(count)
            component = self._launch(name, args_for(ports))
            try:
                component.wait_until(ready_for(ports), "ready", timeout)
                return component, ports
            except ControlPlaneError as exc:
                if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                    raise
                component.stop()
                self.components.remove(component)
        raise AssertionError("unreachable")

    def _start_etcd(self) -> None:
        def args(ports: list[int]) -> list[str]:
            client_url, peer_url = (f"http://{LOOPBACK}:{port}" for port in ports)
            return [
                str(self.binaries.etcd),
                "--name=kubegpu-test",
                f"--data-dir={self.run_dir / 'etcd-data'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=kubegpu-test={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ]

        def ready(ports: list[int]) -> Callable[[], bool]:
            return lambda: http_ok(f"http://{LOOPBACK}:{ports[0]}/health")

        _, ports = self._start_on_free_ports("etcd", 2, args, ready, self.startup_timeout)
        self.etcd_url = f"http://{LOOPBACK}:{ports[0]}"

    def _apiserver_args(self, port: int) -> list[str]:
        url = f"https://{LOOPBACK}:{port}"
        sa_key, sa_pub = self.pki.service_account_key, self.pki.service_account_public_key
        return [
            str(self.binaries.apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--tls-cert-file={self.pki.cert('apiserver')}",
            f"--tls-private-key-file={self.pki.key('apiserver')}",
            f"--client-ca-file={self.pki.ca_cert}",
            # Front-proxy (request header) authentication, as kubeadm sets it up, so that
            # delegating components (kube-scheduler) find the CA they look up.
            f"--requestheader-client-ca-file={self.pki.ca_cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--service-account-issuer={url}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            f"--authorization-mode={self.authorization_mode}",
            # A node's kubelet may write only its own Node and its pods' status.
            "--enable-admission-plugins=NodeRestriction",
            # logs, exec, attach, port-forward: the apiserver calls kubelets with a client
            # certificate and checks their serving certificates against the cluster CA.
            f"--kubelet-client-certificate={self.pki.cert(KUBELET_CLIENT)}",
            f"--kubelet-client-key={self.pki.key(KUBELET_CLIENT)}",
            f"--kubelet-certificate-authority={self.pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # There is no routable address; loopback endpoints are invalid for the
            # "kubernetes" Service, so do not reconcile them.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            *self.apiserver_extra_args,
        ]

    def _start_apiserver(self) -> None:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))

        def ready(ports: list[int]) -> Callable[[], bool]:
            return lambda: http_ok(f"https://{LOOPBACK}:{ports[0]}/readyz", context)

        _, ports = self._start_on_free_ports(
            "kube-apiserver", 1, lambda p: self._apiserver_args(p[0]), ready, self.startup_timeout
        )
        self.url = f"https://{LOOPBACK}:{ports[0]}"

    # ---- kubeconfigs and clients

    @property
    def admin_kubeconfig(self) -> Path:
        return self.run_dir / "admin.kubeconfig"

    def write_kubeconfig(self, name: str, user: str, credentials: Mapping[str, str]) -> Path:
        """Write ``<run_dir>/<name>.kubeconfig`` for ``user`` and return its path."""
        path = self.run_dir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.url, self.pki.ca_cert, user, credentials)))
        path.chmod(0o600)
        return path

    def client_cert_kubeconfig(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """Issue a client certificate (CN=user, O=groups) and write a kubeconfig using it."""
        subject = f"/CN={user}" + "".join(f"/O={group}" for group in groups)
        cert, key = self.pki.issue(name, subject)
        credentials = {"client-certificate": str(cert), "client-key": str(key)}
        return self.write_kubeconfig(name, user, credentials)

    def _write_admin_kubeconfig(self) -> None:
        self.client_cert_kubeconfig("admin", ADMIN_USER, ("system:masters",))

    def admin_client(self) -> k8s.ApiClient:
        """A new ApiClient authenticated as a system:masters user."""
        return new_client_from_config(config_file=str(self.admin_kubeconfig))

    def service_account_kubeconfig(
        self, namespace: str, name: str, expiration_seconds: int = 3600
    ) -> Path:
        """Kubeconfig with a TokenRequest token for ServiceAccount ``namespace/name``.

        The namespace and the ServiceAccount are created when missing.
        """
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
        )
        with self.admin_client() as admin:
            core = k8s.CoreV1Api(admin)
            ensure_namespace(core, namespace)
            ensure_service_account(core, namespace, name)
            token = core.create_namespaced_service_account_token(name, namespace, request)
        user = f"system:serviceaccount:{namespace}:{name}"
        return self.write_kubeconfig(f"sa-{namespace}-{name}", user, {"token": token.status.token})

    def service_account_client(self, namespace: str, name: str) -> k8s.ApiClient:
        """A new ApiClient acting as ServiceAccount ``namespace/name`` (created when missing)."""
        path = self.service_account_kubeconfig(namespace, name)
        return new_client_from_config(config_file=str(path))

    # ---- scheduler

    def start_scheduler(
        self,
        config: str | Mapping[str, Any] | None = None,
        leader_elect: bool = False,
        timeout: float | None = None,
        extra_args: Sequence[str] = (),
    ) -> Component:
        """Start a kube-scheduler with a KubeSchedulerConfiguration (yaml text or dict).

        It authenticates as ``system:kube-scheduler`` (the identity the bootstrap RBAC policy
        grants the scheduler's permissions), serves on a free loopback port and is returned once
        its /readyz answers. Stop it with ``stop()`` on the returned Component or with the
        control plane.
        """
        self._scheduler_count += 1
        name = f"kube-scheduler-{self._scheduler_count}"
        kubeconfig_path = self.client_cert_kubeconfig(name, SCHEDULER_USER)
        config_path = self.run_dir / f"{name}.config.yaml"
        config_path.write_text(
            yaml.safe_dump(scheduler_config(config, kubeconfig_path, leader_elect))
        )
        certs = self.run_dir / f"{name}-certs"

        def args(ports: list[int]) -> list[str]:
            return [
                str(self.binaries.scheduler),
                f"--config={config_path}",
                f"--authentication-kubeconfig={kubeconfig_path}",
                f"--authorization-kubeconfig={kubeconfig_path}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={ports[0]}",
                f"--cert-dir={certs}",
                *extra_args,
            ]

        insecure = ssl.create_default_context()  # self-signed serving cert, loopback only
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def ready(ports: list[int]) -> Callable[[], bool]:
            return lambda: http_ok(f"https://{LOOPBACK}:{ports[0]}/readyz", insecure)

        scheduler, _ = self._start_on_free_ports(
            name, 1, args, ready, timeout or self.startup_timeout
        )
        return scheduler

    # ---- controller manager

    def start_controller_manager(
        self, binary: Path, timeout: float | None = None, extra_args: Sequence[str] = ()
    ) -> Component:
        """Start kube-controller-manager with every default controller; return it once healthy.

        It authenticates as ``system:kube-controller-manager`` and gives each controller its own
        ServiceAccount credentials, as kubeadm sets it up; it signs ServiceAccount tokens with
        the cluster's key, publishes the CA as ``kube-root-ca.crt`` and signs CSRs with the CA.
        Its FlexVolume directory (which it creates) is under the run dir: the default is a host
        path, /usr/libexec/kubernetes/kubelet-plugins/volume/exec.
        """
        name = "kube-controller-manager"
        kubeconfig_path = self.client_cert_kubeconfig(name, CONTROLLER_MANAGER_USER)
        certs = self.run_dir / f"{name}-certs"

        def args(ports: list[int]) -> list[str]:
            return [
                str(binary),
                f"--kubeconfig={kubeconfig_path}",
                f"--authentication-kubeconfig={kubeconfig_path}",
                f"--authorization-kubeconfig={kubeconfig_path}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={ports[0]}",
                f"--cert-dir={certs}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.pki.service_account_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                f"--cluster-signing-cert-file={self.pki.ca_cert}",
                f"--cluster-signing-key-file={self.pki.ca_key}",
                f"--flex-volume-plugin-dir={self.run_dir / 'flex-volume'}",
                *extra_args,
            ]

        insecure = ssl.create_default_context()  # self-signed serving cert, loopback only
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def ready(ports: list[int]) -> Callable[[], bool]:
            return lambda: http_ok(f"https://{LOOPBACK}:{ports[0]}/healthz", insecure)

        manager, _ = self._start_on_free_ports(name, 1, args, ready, timeout or self.startup_timeout)
        return manager

    # ---- logs

    def log_paths(self) -> dict[str, Path]:
        """Log file of every component started so far, by component name."""
        return {component.name: component.log_path for component in self.components}

    def log_tails(self, lines: int = 50, include_stopped: bool = True) -> dict[str, str]:
        """Last ``lines`` lines of each component's log, by component name.

        ``include_stopped=False`` leaves out components that were stopped on purpose (such as
        an earlier test's scheduler) but keeps running and crashed ones.
        """
        return {
            component.name: component.tail(lines)
            for component in self.components
            if include_stopped or not component.stopped
        }


# --------------------------------------------------------------------------- client helpers


def _exists(call: Any, *args: str) -> bool:
    try:
        call(*args)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def ensure_namespace(core: k8s.CoreV1Api, name: str) -> None:
    """Create namespace ``name`` and its ``default`` ServiceAccount when missing.

    There is no kube-controller-manager, so nothing else creates the ``default``
    ServiceAccount that the ServiceAccount admission plugin requires for every pod.
    """
    if not _exists(core.read_namespace, name):
        body = k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name))
        _create_ignoring_conflict(core.create_namespace, body)
    ensure_service_account(core, name, "default")


def ensure_service_account(core: k8s.CoreV1Api, namespace: str, name: str) -> None:
    """Create ServiceAccount ``namespace/name`` when missing."""
    if not _exists(core.read_namespaced_service_account, name, namespace):
        body = k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name))
        _create_ignoring_conflict(core.create_namespaced_service_account, namespace, body)


def _create_ignoring_conflict(create: Any, *args: Any) -> None:
    try:
        create(*args)
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise


def fake_node(
    name: str,
    labels: Mapping[str, str] | None = None,
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node manifest whose status is what a kubelet would report: Ready, with ``capacity``.

    ``capacity`` adds to (or overrides) cpu 8, memory 32Gi and pods 110; allocatable equals
    capacity. :func:`create_fake_node` creates the node and then writes this status through
    the status subresource, as a kubelet does.
    """
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110", **dict(capacity or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "fake node (no kubelet)",
                },
            ],
        },
    }


# Taints the apiserver's TaintNodesByCondition admission puts on a new node and the node
# lifecycle controller (not running here) removes once the node reports Ready.
CONDITION_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def create_fake_node(
    core: k8s.CoreV1Api,
    name: str,
    labels: Mapping[str, str] | None = None,
    capacity: Mapping[str, str] | None = None,
) -> k8s.V1Node:
    """Create a Node that a scheduler can use although no kubelet runs.

    Sets its status (status subresource) to Ready with ``capacity`` and then drops the
    not-ready taint, as the node lifecycle controller would.
    """
    manifest = fake_node(name, labels, capacity)
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": manifest["metadata"]})
    core.patch_node_status(name, {"status": manifest["status"]}, _content_type=MERGE_PATCH)
    node = core.read_node(name)
    kept = [t for t in node.spec.taints or [] if t.key not in CONDITION_TAINTS]
    taints = [core.api_client.sanitize_for_serialization(t) for t in kept]
    patch = {
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": taints or None},
    }
    return core.patch_node(name, patch, _content_type=MERGE_PATCH)
